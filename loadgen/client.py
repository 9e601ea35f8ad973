"""One streamed request through Locust's HttpSession: timing, failure kind, intentional abort, client log.

The body is read through public APIs only: a chunked body (what every SSE server sends over
HTTP/1.1) through requests' `iter_content(chunk_size=None)`, which hands over each HTTP chunk as it
arrives; any other body through urllib3's `HTTPResponse.read1`, one read of what has arrived. Each
piece is timed when the read returns it.
"""

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import requests
from gevent import GreenletExit
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from loadgen.clientlog import ClientLog
from loadgen.records import FailureKind, Outcome, RequestRecord, TokenSource
from loadgen.sse import SSEParser

READ_SIZE = 65536  # most bytes one read hands over; a read never waits for more than what has arrived


class StreamFailure(Exception):
    """Base of the failures Locust shows in its failures table, one class per kind."""

    kind = FailureKind.STREAM_CUT


class HttpStatusFailure(StreamFailure):
    kind = FailureKind.HTTP_STATUS


class ErrorEventFailure(StreamFailure):
    kind = FailureKind.ERROR_EVENT


class StreamCutFailure(StreamFailure):
    kind = FailureKind.STREAM_CUT


class TimeoutFailure(StreamFailure):
    kind = FailureKind.TIMEOUT


class ConnectFailure(StreamFailure):
    kind = FailureKind.CONNECT_ERROR


FAILURE_CLASSES = {cls.kind: cls for cls in (HttpStatusFailure, ErrorEventFailure, StreamCutFailure,
                                              TimeoutFailure, ConnectFailure)}


@dataclass(slots=True)
class RequestSpec:
    path: str  # /v1/chat/completions or /v1/completions
    body: dict
    name: str  # Locust row name
    max_tokens: int


@dataclass(slots=True)
class StreamSettings:
    timeout_s: float = 300.0  # read timeout: longest silence between two bytes
    connect_timeout_s: float = 10.0
    abort_after_tokens: int | None = None  # abort profile: close the stream after this many chunks
    headers: dict | None = None


def describe_exception(exc: BaseException) -> str:
    """`module.Class: message`, the way a traceback's last line words it."""
    cls = type(exc)
    module = cls.__module__
    prefix = "" if module == "builtins" else f"{module}."
    return f"{prefix}{cls.__qualname__}: {exc}"


def is_read_timeout(exc: BaseException) -> bool:
    if isinstance(exc, requests.exceptions.Timeout):
        return True
    inner = exc.args[0] if exc.args else None
    return isinstance(inner, ReadTimeoutError) or "Read timed out" in str(exc)


def run_request(session, spec: RequestSpec, record: RequestRecord, settings: StreamSettings,
                scheduled_ts: float, clock: Callable[[], float] = time.perf_counter,
                log: ClientLog | None = None) -> str:
    """Send `spec`, stream it to the end, fill `record` (durations from `scheduled_ts`) and return the
    answer's text; never raises except GreenletExit (test stopped), after which the record reads
    `incomplete`."""
    return exchange(session, spec, record, settings, scheduled_ts, clock, log, stream=True,
                    consume=lambda resp: _consume(resp, record, settings, scheduled_ts, clock))


def exchange(session, spec: RequestSpec, record: RequestRecord, settings: StreamSettings, scheduled_ts: float,
             clock: Callable[[], float], log: ClientLog | None, stream: bool,
             consume: Callable[[object], tuple[StreamFailure | None, str]]) -> str:
    """The request around `consume` (which reads the answer into `record`): headers, timeouts, Locust's
    success or failure, the end time and the client log; streamed or not."""
    record.max_tokens = spec.max_tokens
    headers = {"x-request-id": record.request_id, **(settings.headers or {})}
    record.client_queue_s = max(0.0, clock() - scheduled_ts)
    try:
        with session.post(spec.path, json=spec.body, headers=headers, name=spec.name, stream=stream,
                          timeout=(settings.connect_timeout_s, settings.timeout_s), catch_response=True) as resp:
            failure, text = consume(resp)
            if failure is None:
                resp.success()
            else:
                resp.failure(failure)
    except GreenletExit:
        record.outcome = Outcome.INCOMPLETE
        record.end_s = clock() - scheduled_ts
        raise
    record.end_s = clock() - scheduled_ts
    if log is not None and record.outcome in (Outcome.FAILED, Outcome.ABORTED):
        log.write(record)
    return text


def _consume(resp, record: RequestRecord, settings: StreamSettings, scheduled_ts: float,
             clock: Callable[[], float]) -> tuple[StreamFailure | None, str]:
    error = getattr(resp, "error", None)
    if getattr(resp, "status_code", 0) == 0 and error is not None:
        timed_out = is_read_timeout(error)
        return fail(record, TimeoutFailure if timed_out else ConnectFailure, describe_exception(error)), ""
    record.http_status = resp.status_code
    if resp.status_code >= 400:
        return fail(record, HttpStatusFailure, http_error_text(resp)), ""
    parser = SSEParser()
    abort_after = settings.abort_after_tokens
    try:
        for data in _arrivals(resp):
            parser.feed(data, clock() - scheduled_ts, abort_after)
            if abort_after is not None and parser.state.num_chunks >= abort_after:
                return _abort(resp, record, parser)
        parser.close(clock() - scheduled_ts)
    except GreenletExit:
        _fill(record, parser)  # the test stopped under it: keep what arrived (the record reads incomplete)
        raise
    except (requests.exceptions.RequestException, Urllib3Error) as exc:
        _fill(record, parser)
        cls = TimeoutFailure if is_read_timeout(exc) else StreamCutFailure
        return fail(record, cls, describe_exception(_as_requests_error(exc))), parser.state.text
    _fill(record, parser)
    if parser.state.error is not None:
        return fail(record, ErrorEventFailure, f"openai.APIError: {parser.state.error}"), parser.state.text
    if not parser.state.done:
        return fail(record, StreamCutFailure,
                     f"loadgen.StreamCut: stream closed after {parser.state.num_chunks} content chunks "
                     f"without data: [DONE] (finish_reason={parser.state.finish_reason})"), parser.state.text
    return None, parser.state.text


def _arrivals(resp):
    """The body's bytes, one piece per read, as they arrive."""
    if resp.raw.chunked:
        yield from resp.iter_content(chunk_size=None)
        return
    read1 = resp.raw.read1
    while data := read1(READ_SIZE):
        yield data


def _as_requests_error(exc: BaseException) -> BaseException:
    """urllib3's errors from a read1 worded as requests words the same errors from iter_content."""
    if isinstance(exc, ReadTimeoutError):
        return requests.exceptions.ConnectionError(exc)
    if isinstance(exc, ProtocolError):
        return requests.exceptions.ChunkedEncodingError(exc)
    return exc


def _abort(resp, record: RequestRecord, parser: SSEParser) -> tuple[None, str]:
    """Abort profile: the client closes the stream (and its connection) on purpose."""
    resp.close()
    _fill(record, parser)
    record.outcome = Outcome.ABORTED
    record.error = f"client cancelled the stream after {parser.state.num_chunks} chunks (abort profile)"
    return None, parser.state.text


def _fill(record: RequestRecord, parser: SSEParser) -> None:
    state = parser.state
    record.ttft_s = state.first_ts
    record.e2e_s = state.last_ts
    record.itl_s = list(state.itl_s)
    record.num_chunks = state.num_chunks
    record.prompt_tokens = state.prompt_tokens
    record.cached_tokens = state.cached_tokens
    record.finish_reason = state.finish_reason
    record.response_id = state.response_id
    if state.completion_tokens is not None:
        record.output_tokens = state.completion_tokens
        record.output_tokens_source = TokenSource.USAGE
    else:
        record.output_tokens = state.num_chunks
        record.output_tokens_source = TokenSource.CHUNKS


def fail(record: RequestRecord, cls: type[StreamFailure], text: str) -> StreamFailure:
    """Mark the record failed with the full text; Locust gets a short one so its table groups by kind."""
    record.outcome = Outcome.FAILED
    record.failure_kind = cls.kind
    record.error = text
    return cls(short_failure(cls.kind, text, record.http_status))


def short_failure(kind: FailureKind, text: str, http_status: int | None = None) -> str:
    if kind is FailureKind.HTTP_STATUS and http_status:
        return f"HTTP {http_status}"
    if kind is FailureKind.ERROR_EVENT:
        return "error event: " + text.removeprefix("openai.APIError: ")[:80]
    return text.split(":", 1)[0]  # the exception's class, e.g. requests.exceptions.ChunkedEncodingError


def http_error_text(resp) -> str:
    """requests' raise_for_status wording, plus the OpenAI error message from the body."""
    reason = resp.reason or ""
    kind = "Client Error" if resp.status_code < 500 else "Server Error"
    text = f"requests.exceptions.HTTPError: {resp.status_code} {kind}: {reason} for url: {resp.url}"
    try:
        body = json.loads(resp.content or b"{}")
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
    except (ValueError, AttributeError, requests.exceptions.RequestException):
        message = None
    return f"{text} ({message})" if message else text


def new_request_id() -> str:
    return f"loadgen-{uuid.uuid4().hex[:16]}"
