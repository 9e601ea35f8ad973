"""The client log (`--client-log`): one line per failed, cut or cancelled request, for llmtriage.

Text lines read like a Python logger's, ending with the exception as requests/openai word it:
`2026-11-29T19:40:01.123Z ERROR loadgen request_id=... kind=stream_cut status=200 elapsed_s=1.204 chunks=7
requests.exceptions.ChunkedEncodingError: ("Connection broken: InvalidChunkLength(...)", ...)`.
"""

import json
import time
from datetime import UTC, datetime
from pathlib import Path

from loadgen.records import Outcome, RequestRecord


class ClientLogError(Exception):
    """The client log file cannot be opened."""


def iso_utc(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class ClientLog:
    def __init__(self, path: str | Path, fmt: str = "text"):
        self.fmt = fmt
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (kept open for the run)
        except OSError as exc:
            raise ClientLogError(f"cannot open client log {path}: {exc.strerror}") from exc

    def write(self, record: RequestRecord, now_unix: float | None = None) -> None:
        now_unix = time.time() if now_unix is None else now_unix
        self._file.write(self.format(record, now_unix) + "\n")
        self._file.flush()

    def format(self, record: RequestRecord, now_unix: float) -> str:
        aborted = record.outcome is Outcome.ABORTED
        level = "info" if aborted else "error"
        kind = "client_abort" if aborted else record.failure_kind.value
        elapsed = record.end_s if record.end_s is not None else now_unix - record.scheduled_unix
        if self.fmt == "json":
            return json.dumps({
                "ts": iso_utc(now_unix), "level": level, "logger": "loadgen",
                "event": "request.aborted" if aborted else "request.failed",
                "request_id": record.request_id, "response_id": record.response_id, "kind": kind, "http_status": record.http_status,
                "elapsed_s": round(elapsed, 6), "chunks": record.num_chunks, "error": record.error,
            })
        status = record.http_status if record.http_status is not None else "-"
        # The text form is a fixed field order that llmtriage parses; the response id is in the JSON form.
        return (f"{iso_utc(now_unix)} {level.upper()} loadgen request_id={record.request_id} kind={kind} "
                f"status={status} elapsed_s={elapsed:.3f} chunks={record.num_chunks} {record.error}")

    def close(self) -> None:
        self._file.close()
