"""Client-side records: loadgen's client log (text and JSON) and per-request CSV / JSON lines."""

import csv
import json
import re

from triage.model import Event
from triage.timeparse import parse_iso

_LOADGEN_TEXT = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT[\d:.]+Z) (?P<level>[A-Z]+) loadgen request_id=(?P<rid>\S+)"
    r"(?: response_id=(?P<resp>\S+))? kind=(?P<kind>\w+) "
    r"status=(?P<status>\S+) elapsed_s=(?P<elapsed>[\d.]+) chunks=(?P<chunks>\d+) ?(?P<error>.*)$")
# loadgen failure kinds -> the normalised client signal
KIND_TO_SIGNAL = {
    "client_abort": "client.cancel", "timeout": "client.timeout", "stream_cut": "client.stream_cut",
    "connect_error": "client.connect_refused", "http_status": "client.http_status", "error_event": "client.error_event",
}
# triage.parsers.MAKES: loadgen's lines name their logger; per-request records carry ttft (a CSV's rows
# have no keyword: FileParser.candidates takes every line of a CSV)
MAKES = (
    *((kind, "loadgen", ("loadgen",), ()) for kind in (*KIND_TO_SIGNAL.values(), "client.failure")),
    ("client.request", "loadgen", ('"e2e_s"', '"itl_s"'), ()),  # (with ttft_s: a record has one of them)
)


def _float(v) -> float | None:
    try:
        return float(v) if v not in (None, "", "-", "None", "null") else None
    except (TypeError, ValueError):
        return None


def _int(v) -> int | None:
    f = _float(v)
    return int(f) if f is not None else None


def loadgen_failure(kind: str, rid: str | None, status, elapsed, chunks, error: str | None,
                    ts, file: str, lineno: int, line: str, response_id: str | None = None) -> Event:
    """The engine's id (the response id) names the request when the client knows it."""
    fields = {"request_id": response_id or rid, "client_request_id": rid, "failure": kind,
              "status": _int(status), "elapsed_s": _float(elapsed), "chunks": _int(chunks), "error": error or ""}
    return Event(ts, "loadgen", KIND_TO_SIGNAL.get(kind, "client.failure"), fields, file, lineno, line)


def parse_loadgen_text(line: str, file: str, lineno: int) -> Event | None:
    m = _LOADGEN_TEXT.match(line)
    if m is None:
        return None
    return loadgen_failure(m.group("kind"), m.group("rid"), m.group("status"), m.group("elapsed"),
                           m.group("chunks"), m.group("error"), parse_iso(m.group("ts")), file, lineno, line,
                           m.group("resp"))


def parse_loadgen_json(obj: dict, line: str, file: str, lineno: int) -> Event | None:
    """loadgen's JSON client log line, or a per-request record with client timings."""
    ts = parse_iso(obj["ts"]) if isinstance(obj.get("ts"), str) else None
    if obj.get("logger") == "loadgen" and "kind" in obj:
        return loadgen_failure(str(obj["kind"]), obj.get("request_id"), obj.get("http_status"),
                               obj.get("elapsed_s"), obj.get("chunks"), obj.get("error"), ts, file, lineno, line,
                               obj.get("response_id"))
    if "ttft_s" in obj and ("e2e_s" in obj or "itl_s" in obj):
        return client_request(obj, ts, file, lineno, line)
    return None


def client_request(row: dict, ts, file: str, lineno: int, line: str) -> Event:
    itl = row.get("itl_s")
    if isinstance(itl, str):
        try:
            itl = json.loads(itl) if itl.startswith("[") else [float(x) for x in itl.split()]
        except ValueError:
            itl = None
    fields = {"request_id": row.get("response_id") or row.get("request_id"), "ttft_s": _float(row.get("ttft_s")),
              "e2e_s": _float(row.get("e2e_s")), "outcome": row.get("outcome"),
              "num_chunks": _int(row.get("num_chunks")), "itl_s": itl if isinstance(itl, list) else None}
    return Event(ts, "loadgen", "client.request", fields, file, lineno, line)


class CsvRecords:
    """A per-request CSV with a `ttft` column (loadgen's, or any benchmark's with ms or s units)."""

    def __init__(self, header: list[str]):
        self.header = header
        self.units = {}
        for name in header:
            low = name.lower()
            key = ("ttft_s" if "ttft" in low else "e2e_s" if low.startswith(("e2e", "latency", "end_to_end"))
                   else "itl_s" if low.startswith("itl") else None)
            if key:
                self.units[name] = (key, 0.001 if low.endswith("ms") else 1.0)

    @staticmethod
    def sniff(line: str) -> "CsvRecords | None":
        if "ttft" not in line.lower() or "," not in line or line.startswith("{"):
            return None
        try:
            header = next(csv.reader([line]))
        except (csv.Error, StopIteration):
            return None
        return CsvRecords(header) if len(header) >= 2 else None

    def parse(self, line: str, file: str, lineno: int) -> Event | None:
        try:
            values = next(csv.reader([line]))
        except (csv.Error, StopIteration):
            return None
        if len(values) != len(self.header):
            return None
        row = dict(zip(self.header, values, strict=True))
        for name, (key, scale) in self.units.items():
            if key == "itl_s":
                row[key] = row[name]
                continue
            v = _float(row[name])
            row[key] = v * scale if v is not None else None
        return client_request(row, None, file, lineno, line)
