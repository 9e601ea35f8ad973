"""One streamed request through Locust's HttpSession: timing, failure kind, intentional abort, client log.

The body is read through public APIs only: a chunked body (what every SSE server sends over
HTTP/1.1) through requests' `iter_content(chunk_size=None)`, which hands over each HTTP chunk as it
arrives; any other body through urllib3's `HTTPResponse.read1`, one read of what has arrived. Each
piece is timed when the read returns it.

Before each request on a kept-alive connection urllib3 checks whether the server closed it
(`HTTPConnection.is_connected`, a poll of the socket with no timeout). Under gevent that poll is
gevent's, and even with no timeout it hands the loop to every other greenlet ready to run before
the request is sent: at 100 users that wait was most of the client's part of TTFT (17.9 ms at the
median against aiohttp, the send itself 0.2 ms). A user's session's pools (`quick_check_pool_manager`)
check with the operating system's poll instead, which returns at once, so a request goes out as soon as
it is made (`QuickCheck` below; the check, a closed connection replaced, is urllib3's own).

The read timeout inside a body (`--timeout-s`, the longest silence between two reads) is one
watchdog greenlet per process for every stream (`ReadWatch`), not a timer per socket read: requests'
own read timeout makes gevent start and cancel a timer for every wait on the socket, about 6% of the
client's CPU per request. Up to the response headers requests' timeout stays in force; on a socket
that is not gevent's (Locust's monkey-patching off) it stays in force for the body too.

requests looks in the process's environment before every request (proxies and `no_proxy`,
`REQUESTS_CA_BUNDLE`/`CURL_CA_BUNDLE`, a `.netrc` file): 0.12 ms a request of the client's CPU,
a fifth of what a user does from its request's start to its connect. Where no proxy and no .netrc
file is there when a run starts, a user's session reads the CA bundle variables once and looks no
more (`read_environment_once`: `trust_env` off, `verify` set): the requests are the same.
"""

import json
import os
import random
import select
import socket
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import gevent
import gevent.monkey
import gevent.socket
import requests
from gevent import GreenletExit
from requests.adapters import DEFAULT_POOLBLOCK, DEFAULT_POOLSIZE
from requests.utils import NETRC_FILES
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.exceptions import ProtocolError, ReadTimeoutError
from urllib3.poolmanager import PoolManager

from loadgen.clientlog import ClientLog
from loadgen.records import FailureKind, Outcome, RequestRecord, TokenSource
from loadgen.sse import SSEParser

READ_SIZE = 65536  # most bytes one read hands over; a read never waits for more than what has arrived
SWEEP_S = 1.0  # the watchdog looks at every stream this often (or a tenth of the read timeout, if less)


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


@dataclass(slots=True, eq=False)
class Silence:
    """One watched body: its socket, its read timeout and the time of its last read."""

    sock: socket.socket
    timeout_s: float
    last: float
    timed_out: bool = False


class ReadWatch:
    """The read timeout of every streamed body of this process: a stream silent for longer than its
    timeout has its socket shut down (its read then ends at once) and is marked `timed_out`. A
    stream counts as silent from its last read; the watchdog checks every SWEEP_S (or a tenth of the
    shortest timeout), so a timeout fires up to that much after the silence passed it."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.streams: set[Silence] = set()
        self.greenlet: gevent.Greenlet | None = None

    def add(self, sock: socket.socket, timeout_s: float) -> Silence:
        silence = Silence(sock, timeout_s, self.clock())
        self.streams.add(silence)
        if self.greenlet is None or self.greenlet.dead:
            self.greenlet = gevent.spawn(self._run)
        return silence

    def discard(self, silence: Silence) -> None:
        self.streams.discard(silence)

    def _run(self) -> None:
        while self.streams:
            gevent.sleep(min(SWEEP_S, min(s.timeout_s for s in self.streams) / 10))
            now = self.clock()
            for silence in [s for s in self.streams if now - s.last > s.timeout_s]:
                silence.timed_out = True
                self.streams.discard(silence)
                try:
                    silence.sock.shutdown(socket.SHUT_RDWR)
                except OSError:  # already closed
                    pass


READ_WATCH = ReadWatch()

POLL = gevent.monkey.get_original("select", "poll")  # the operating system's: never yields to the loop


class QuickCheck:
    """`is_connected` as urllib3 has it (the socket is open and has nothing to read: a kept-alive
    connection the server closed reads as its end), through a poll that does not yield."""

    @property
    def is_connected(self) -> bool:
        if self.sock is None:
            return False
        poller = POLL()
        poller.register(self.sock, select.POLLIN)
        return not poller.poll(0)


class QuickCheckHTTPConnection(QuickCheck, HTTPConnection):
    pass


class QuickCheckHTTPSConnection(QuickCheck, HTTPSConnection):
    pass


class QuickCheckHTTPPool(HTTPConnectionPool):
    ConnectionCls = QuickCheckHTTPConnection

    def __str__(self) -> str:  # errors read as urllib3's own: HTTPConnectionPool(host=..., port=...)
        return f"HTTPConnectionPool(host={self.host!r}, port={self.port!r})"


class QuickCheckHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = QuickCheckHTTPSConnection

    def __str__(self) -> str:
        return f"HTTPSConnectionPool(host={self.host!r}, port={self.port!r})"


def quick_check_pool_manager() -> PoolManager:
    """A user's connection pools as requests' HTTPAdapter makes its own (10 pools of up to 10 kept-alive
    connections, never blocking), of QuickCheck connections. Given to HttpUser as its `pool_manager`,
    the session's http:// and https:// adapters share it: no adapter or pools made only to be replaced."""
    manager = PoolManager(num_pools=DEFAULT_POOLSIZE, maxsize=DEFAULT_POOLSIZE, block=DEFAULT_POOLBLOCK)
    manager.pool_classes_by_scheme = {"http": QuickCheckHTTPPool, "https": QuickCheckHTTPSPool}
    return manager


CA_BUNDLE_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")  # requests reads them in this order


def verify_from_environment() -> bool | str | None:
    """What requests takes from this process's environment for every request, where it is the same
    for every request: None where a proxy is set (the operating system's, as urllib reads them,
    `no_proxy` included) or a .netrc file is where requests looks for one (`NETRC`, else ~/.netrc and
    ~/_netrc), which depend on the URL; else the CA bundle its variables name, or True (requests'
    default) without one."""
    if urllib.request.getproxies():
        return None
    netrc = os.environ.get("NETRC")
    places = (netrc,) if netrc is not None else tuple(f"~/{name}" for name in NETRC_FILES)
    if any(os.path.exists(os.path.expanduser(place)) for place in places):
        return None
    return next((os.environ[name] for name in CA_BUNDLE_VARIABLES if os.environ.get(name)), True)


def read_environment_once(session: requests.Session, verify: bool | str | None) -> None:
    """A session that sends the requests it would send looking in the environment before each (its
    `trust_env`), without looking: given `verify_from_environment()` read as the run starts (None:
    the session keeps looking). (For requests that leave `verify` unset, as loadgen's do: requests
    also puts the CA bundle variable in place of an explicit `verify=True`.)"""
    if verify is None:
        return
    session.trust_env = False
    session.verify = verify


def watch_body(resp, timeout_s: float) -> Silence | None:
    """Hand the body's read timeout from requests to READ_WATCH (gevent sockets only)."""
    conn = resp.raw.connection
    sock = conn.sock if conn is not None else None
    if not isinstance(sock, gevent.socket.socket):
        return None
    sock.settimeout(None)  # (urllib3 sets the timeouts again for the connection's next request)
    return READ_WATCH.add(sock, timeout_s)


def read_timeout_text(resp) -> str:
    """How requests words a read timeout in the body: ConnectionError(ReadTimeoutError)."""
    pool = resp.connection.poolmanager.connection_from_url(resp.url)
    return describe_exception(requests.exceptions.ConnectionError(ReadTimeoutError(pool, resp.url, "Read timed out.")))


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
    silence = watch_body(resp, settings.timeout_s)
    try:
        return _read_stream(resp, record, settings, scheduled_ts, clock, parser, silence)
    finally:
        if silence is not None:
            READ_WATCH.discard(silence)


def _read_stream(resp, record: RequestRecord, settings: StreamSettings, scheduled_ts: float,
                 clock: Callable[[], float], parser: SSEParser,
                 silence: Silence | None) -> tuple[StreamFailure | None, str]:
    abort_after = settings.abort_after_tokens
    try:
        for data in _arrivals(resp):
            now = clock()
            if silence is not None:
                silence.last = now
            parser.feed(data, now - scheduled_ts, abort_after)
            if abort_after is not None and parser.state.num_chunks >= abort_after:
                return _abort(resp, record, parser)
        parser.close(clock() - scheduled_ts)
    except GreenletExit:
        _fill(record, parser)  # the test stopped under it: keep what arrived (the record reads incomplete)
        raise
    except (requests.exceptions.RequestException, Urllib3Error) as exc:
        _fill(record, parser)
        if silence is not None and silence.timed_out:  # the watchdog shut the socket
            return fail(record, TimeoutFailure, read_timeout_text(resp)), parser.state.text
        cls = TimeoutFailure if is_read_timeout(exc) else StreamCutFailure
        return fail(record, cls, describe_exception(_as_requests_error(exc))), parser.state.text
    _fill(record, parser)
    if silence is not None and silence.timed_out:  # (a body without chunks just ends when shut)
        return fail(record, TimeoutFailure, read_timeout_text(resp)), parser.state.text
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


REQUEST_IDS = random.Random()  # seeded from os.urandom, once per process
os.register_at_fork(after_in_child=REQUEST_IDS.seed)  # and again in each worker Locust's --processes forks


def new_request_id() -> str:
    """`loadgen-` and 16 hex digits, 64 random bits (a uuid4 would cost a system call a request)."""
    return f"loadgen-{REQUEST_IDS.getrandbits(64):016x}"
