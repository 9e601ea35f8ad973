"""One record per streamed request: outcome, failure kind and every timing, portable between processes."""

import time
from dataclasses import dataclass, field, fields
from enum import StrEnum


def _perf_to_unix_offset(num_samples: int = 9) -> float:
    """time.time() - time.perf_counter(), from the pair of reads least apart (a read pair the process was
    descheduled between would be off by as long as it waited)."""
    best = None
    for _ in range(num_samples):
        before = time.perf_counter()
        unix = time.time()
        after = time.perf_counter()
        if best is None or after - before < best[0]:
            best = (after - before, unix - (before + after) / 2)
    return best[1]


PERF_TO_UNIX_S = _perf_to_unix_offset()  # once per process: every record on one timeline


def perf_to_unix(ts: float) -> float:
    """A time.perf_counter() reading on the wall clock (to align records of several processes)."""
    return ts + PERF_TO_UNIX_S


class Outcome(StrEnum):
    OK = "ok"
    FAILED = "failed"
    ABORTED = "aborted"  # the client cancelled on purpose (abort profile): not a failure
    INCOMPLETE = "incomplete"  # still streaming when the test stopped: neither success nor failure


class FailureKind(StrEnum):
    HTTP_STATUS = "http_status"  # non-2xx answer before any stream
    ERROR_EVENT = "error_event"  # `data: {"error": ...}` inside the stream
    STREAM_CUT = "stream_cut"  # connection closed mid-stream, or no `data: [DONE]`
    TIMEOUT = "timeout"  # no byte within the read timeout
    CONNECT_ERROR = "connect_error"  # no connection at all (refused, reset before headers)


class TokenSource(StrEnum):
    USAGE = "usage"  # usage.completion_tokens from the server
    CHUNKS = "chunks"  # fallback: content chunks counted, flagged in the report


@dataclass(slots=True)
class RequestRecord:
    """Durations are seconds from the scheduled send time (poisson) or the send time (closed loop)."""

    request_id: str
    worker: str
    profile: str
    scheduled_unix: float  # wall clock, only to align records from several processes on one timeline
    client_queue_s: float = 0.0  # actual send minus scheduled send (open loop only)
    outcome: Outcome = Outcome.OK
    failure_kind: FailureKind | None = None
    http_status: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None  # to the last content chunk
    end_s: float | None = None  # when the request was over for the client (any outcome)
    itl_s: list[float] = field(default_factory=list)
    num_chunks: int = 0
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    output_tokens_source: TokenSource | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    max_tokens: int | None = None
    response_id: str | None = None  # the server's completion id, to join with its logs

    @property
    def tpot_s(self) -> float | None:
        """vLLM's TPOT: (e2e - ttft) / (output tokens - 1); None with fewer than two tokens."""
        if self.ttft_s is None or self.e2e_s is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def chunk_offsets_s(self) -> list[float]:
        """Arrival of each content chunk, seconds after the scheduled send."""
        if self.ttft_s is None:
            return []
        offsets = [self.ttft_s]
        for gap in self.itl_s:
            offsets.append(offsets[-1] + gap)
        return offsets

    def to_dict(self) -> dict:
        """Plain values (enums as their strings): what asdict gives, without its deep copy of each field."""
        data = {name: getattr(self, name) for name in _FIELD_NAMES}
        data["itl_s"] = list(self.itl_s)
        for key in ("outcome", "failure_kind", "output_tokens_source"):
            if data[key] is not None:
                data[key] = data[key].value
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "RequestRecord":
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["outcome"] = Outcome(kwargs.get("outcome", "ok"))
        if kwargs.get("failure_kind") is not None:
            kwargs["failure_kind"] = FailureKind(kwargs["failure_kind"])
        if kwargs.get("output_tokens_source") is not None:
            kwargs["output_tokens_source"] = TokenSource(kwargs["output_tokens_source"])
        return cls(**kwargs)


_FIELD_NAMES = tuple(f.name for f in fields(RequestRecord))
