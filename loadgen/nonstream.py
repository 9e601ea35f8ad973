"""One non-streamed request (`--no-stream`): the whole answer in one JSON body, E2E only.

The way batch clients and many gateways call a model: `stream: false`, so nothing reaches the
client until the last token is generated. TTFT and ITL cannot be measured from the client (the first
token arrives with the last) and stay empty; E2E is the time to the complete body. This is also the
traffic a gateway's `proxy_read_timeout` cuts when a generation outlasts it: nginx answers 504
while the engine is still generating.
"""

import json
import time
from collections.abc import Callable

import requests

from loadgen.client import (
    ConnectFailure,
    HttpStatusFailure,
    RequestSpec,
    StreamCutFailure,
    StreamFailure,
    StreamSettings,
    TimeoutFailure,
    describe_exception,
    exchange,
    fail,
    http_error_text,
    is_read_timeout,
)
from loadgen.clientlog import ClientLog
from loadgen.records import RequestRecord, TokenSource


def run_request(session, spec: RequestSpec, record: RequestRecord, settings: StreamSettings,
                scheduled_ts: float, clock: Callable[[], float] = time.perf_counter,
                log: ClientLog | None = None) -> str:
    """Send `spec` (stream false), wait for the body, fill `record` and return the answer's text;
    never raises except GreenletExit (test stopped), after which the record reads `incomplete`."""
    return exchange(session, spec, record, settings, scheduled_ts, clock, log, stream=False,
                    consume=lambda resp: _consume(resp, record, clock() - scheduled_ts))


def _consume(resp, record: RequestRecord, elapsed_s: float) -> tuple[StreamFailure | None, str]:
    error = getattr(resp, "error", None)
    if getattr(resp, "status_code", 0) == 0 and error is not None:
        return fail(record, _failure_class(error), describe_exception(error)), ""
    record.http_status = resp.status_code
    if resp.status_code >= 400:
        return fail(record, HttpStatusFailure, http_error_text(resp)), ""
    try:
        body = json.loads(resp.content or b"")
    except (ValueError, requests.exceptions.RequestException) as exc:
        return fail(record, StreamCutFailure, f"loadgen.BadBody: the response body is not JSON ({exc})"), ""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return fail(record, StreamCutFailure, "loadgen.BadBody: the response has no choices"), ""
    choice = choices[0]
    message = choice.get("message")
    text = (message.get("content") if isinstance(message, dict) else choice.get("text")) or ""
    record.e2e_s = elapsed_s
    record.finish_reason = choice.get("finish_reason")
    record.response_id = body.get("id")
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    record.prompt_tokens = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    record.cached_tokens = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(usage.get("completion_tokens"), int):
        record.output_tokens = usage["completion_tokens"]
        record.output_tokens_source = TokenSource.USAGE
    return None, text


def _failure_class(error: BaseException) -> type[StreamFailure]:
    """No answer: a read timeout, a body cut short (the server or a gateway closed), or no connection."""
    if is_read_timeout(error):
        return TimeoutFailure
    if isinstance(error, requests.exceptions.ChunkedEncodingError) or "IncompleteRead" in str(error) \
            or "Response ended prematurely" in str(error):
        return StreamCutFailure
    return ConnectFailure
