"""The chunked body read straight off the connection: framing split anywhere, each read timed as it
returns, cut streams and timeouts classified as before, keep-alive kept after a complete body."""

import itertools
import json
import socket
import threading
import time
import zlib

import pytest
from locust.clients import HttpSession

from loadgen.chunked import ChunkedBody
from loadgen.client import RequestSpec, StreamSettings, run_request
from loadgen.records import FailureKind, Outcome, RequestRecord, TokenSource
from tests.loadgen.conftest import user_session

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")


def sse(payload) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


def token(text: str) -> bytes:
    return sse({"id": "chatcmpl-t", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


ROLE = sse({"id": "chatcmpl-t", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
FINISH = sse({"id": "chatcmpl-t", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
USAGE = sse({"id": "chatcmpl-t", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3,
                                                           "prompt_tokens_details": {"cached_tokens": 2}}})
DONE = sse("[DONE]")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


END = b"0\r\n\r\n"


class Ticks:
    """The client's clock: one tick per call, and a way for the server to wait for the next read."""

    def __init__(self) -> None:
        self.n = 0
        self.cond = threading.Condition()

    def __call__(self) -> float:
        with self.cond:
            self.n += 1
            self.cond.notify_all()
            return float(self.n)

    def wait_beyond(self, n: int, timeout_s: float = 5.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.n > n, timeout_s)


class ScriptedServer:
    """Answers each request with the next script: bytes are sent, READ waits until the client has
    read what was sent (its clock ticked: a read returned), a float sleeps, CLOSE ends the connection."""

    READ = object()
    CLOSE = object()

    def __init__(self, scripts: list[list], ticks: Ticks):
        self.scripts = list(scripts)
        self.ticks = ticks
        self.connections = 0
        self.missed_reads = 0  # READ steps the client never got to: it waited for more than was there
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.scripts:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            buf = b""
            while self.scripts:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                if not self._answer(conn, self.scripts.pop(0)):
                    return

    def _answer(self, conn: socket.socket, script: list) -> bool:
        seen = self.ticks.n
        for step in script:
            if step is self.READ:
                if not self.ticks.wait_beyond(seen):
                    self.missed_reads += 1
                seen = self.ticks.n
            elif step is self.CLOSE:
                conn.shutdown(socket.SHUT_RDWR)
                return False
            elif isinstance(step, float):
                time.sleep(step)
            else:
                try:
                    conn.sendall(step)
                except OSError:  # the client gave up (timeout test)
                    return False
        return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def scripted():
    servers = []

    def start(*scripts: list) -> tuple[ScriptedServer, Ticks]:
        ticks = Ticks()
        servers.append(ScriptedServer(list(scripts), ticks))
        return servers[-1], ticks

    yield start
    for server in servers:
        server.close()


def request(port: int, ticks: Ticks, session: HttpSession | None = None, timeout_s: float = 5.0):
    session = session or user_session(f"http://127.0.0.1:{port}")
    record = RequestRecord(request_id="req-1", worker="local", profile="steady", scheduled_unix=0.0)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    spec = RequestSpec(path="/v1/chat/completions", body=body, name="chat", max_tokens=3)
    text = run_request(session, spec, record, StreamSettings(timeout_s=timeout_s), 0.0, clock=ticks)
    return record, text, session


R = ScriptedServer.READ


def test_each_read_is_timed_as_it_returns_and_events_split_anywhere_count_once(scripted):
    t1, t2, t3 = token("a"), token("b"), token("c")
    body = chunk(ROLE) + chunk(t1[:20]) + chunk(t1[20:] + t2) + chunk(t3) + chunk(FINISH + USAGE + DONE) + END
    cut1 = body.index(t1[20:]) - 4  # inside the chunk-size line of the chunk that completes token a
    cut2 = body.index(t3) - 3  # token b is complete by then, token c has its size line only
    cut3 = body.index(t3) + 10  # inside token c's data
    server, ticks = scripted([HEAD, body[:cut1], R, body[cut1:cut2], R, body[cut2:cut3], R, body[cut3:]])
    record, text, _ = request(server.port, ticks)
    assert server.missed_reads == 0  # every read returned what had arrived, without waiting for more
    assert record.outcome is Outcome.OK and text == "abc"
    # tick 1: the client_queue clock; the reads are ticks 2 to 5 (plus the headers read by http.client)
    assert record.ttft_s == 3.0  # token a completed in the second body read
    assert record.itl_s == [0.0, 2.0]  # b arrived with a; c was completed by the fourth read
    assert (record.output_tokens, record.output_tokens_source) == (3, TokenSource.USAGE)
    assert (record.prompt_tokens, record.cached_tokens, record.finish_reason) == (5, 2, "length")


def test_crlf_comments_multiline_data_and_trailers(scripted):
    events = (b": keep-alive\r\n\r\n" + ROLE.replace(b"\n", b"\r\n") + b"event: message\r\nid: 7\r\n"
              + b'data: {"choices": [{"index": 0,\r\ndata: "delta": {"content": "x"}}]}\r\n\r\n'
              + b":ping\n\n" + token("y") + USAGE + DONE.replace(b"\n", b"\r\n"))
    body = b"".join(chunk(events[i:i + 7]) for i in range(0, len(events), 7))
    server, ticks = scripted([HEAD, body[:50], R, body[50:], b"0\r\nX-Trailer: 1\r\n\r\n"])
    record, text, _ = request(server.port, ticks)
    assert record.outcome is Outcome.OK and text == "xy"
    assert record.num_chunks == 2 and record.output_tokens == 3


def test_complete_body_keeps_the_connection_for_the_next_request(scripted):
    body = chunk(ROLE + token("a")) + chunk(USAGE + DONE) + END
    server, ticks = scripted([HEAD, body], [HEAD, body[:10], R, body[10:]])
    first, _, session = request(server.port, ticks)
    second, _, _ = request(server.port, ticks, session)
    assert first.outcome is Outcome.OK and second.outcome is Outcome.OK
    assert server.connections == 1


@pytest.mark.parametrize("tail, error", [
    (b"", "requests.exceptions.ChunkedEncodingError: Response ended prematurely"),  # at a chunk boundary
    (b"40\r\n" + token("b")[:10], "requests.exceptions.ChunkedEncodingError: "
                                  "('Connection broken: IncompleteRead("),  # inside a chunk's data
    (b"zz\r\n", "requests.exceptions.ChunkedEncodingError: "
                "(\"Connection broken: InvalidChunkLength(got length b'zz"),  # not a chunk size
])
def test_cut_streams_are_stream_cuts_with_requests_wording(scripted, tail, error):
    server, ticks = scripted([HEAD, chunk(ROLE + token("a")), R, tail, ScriptedServer.CLOSE])
    record, text, _ = request(server.port, ticks)
    assert (record.outcome, record.failure_kind) == (Outcome.FAILED, FailureKind.STREAM_CUT)
    assert record.error.startswith(error)
    assert text == "a" and record.num_chunks == 1 and record.ttft_s is not None


def test_body_ending_without_done_and_error_events(scripted):
    error = sse({"error": {"message": "CUDA out of memory", "type": "internal_error"}})
    server, ticks = scripted([HEAD, chunk(ROLE + token("a") + USAGE) + END],
                             [HEAD, chunk(token("a")), R, chunk(error + DONE) + END])
    cut, _, session = request(server.port, ticks)
    assert (cut.failure_kind, cut.error) == (FailureKind.STREAM_CUT, "loadgen.StreamCut: stream closed after 1 "
                                             "content chunks without data: [DONE] (finish_reason=None)")
    failed, _, _ = request(server.port, ticks, session)
    assert (failed.failure_kind, failed.error) == (FailureKind.ERROR_EVENT, "openai.APIError: CUDA out of memory")


def test_silence_is_a_read_timeout(scripted):
    server, ticks = scripted([HEAD, chunk(ROLE), 1.0, END])
    record, _, _ = request(server.port, ticks, timeout_s=0.2)
    assert (record.outcome, record.failure_kind) == (Outcome.FAILED, FailureKind.TIMEOUT)
    assert record.error.startswith("requests.exceptions.ConnectionError: HTTPConnectionPool(")
    assert record.error.endswith("Read timed out.")


def test_content_length_body_still_streams(scripted):
    events = ROLE + token("a") + token("b") + USAGE + DONE
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(events)
    cut = len(ROLE + token("a")) + 10
    server, ticks = scripted([head, events[:cut], R, events[cut:]], [head, events[:cut], ScriptedServer.CLOSE])
    record, text, session = request(server.port, ticks)
    assert server.missed_reads == 0  # read1: what had arrived, not the whole Content-Length
    assert record.outcome is Outcome.OK and text == "ab" and record.output_tokens == 3
    cut, _, _ = request(server.port, ticks, session)
    assert (cut.failure_kind, cut.num_chunks) == (FailureKind.STREAM_CUT, 1)
    assert cut.error.startswith("requests.exceptions.ChunkedEncodingError: ('Connection broken: IncompleteRead(")


def test_compressed_stream_is_decoded_as_it_arrives(scripted):
    gzip = zlib.compressobj(wbits=31)
    parts = [gzip.compress(ROLE + token("a")) + gzip.flush(zlib.Z_SYNC_FLUSH),
             gzip.compress(token("b") + USAGE + DONE) + gzip.flush()]
    head = HEAD.replace(b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\n\r\n")
    server, ticks = scripted([head, chunk(parts[0]), R, chunk(parts[1]) + END])
    record, text, _ = request(server.port, ticks)
    assert server.missed_reads == 0
    assert record.outcome is Outcome.OK and text == "ab" and record.itl_s == [1.0]


class _Raw:
    def tell(self) -> int:
        return 0


@pytest.mark.parametrize("step", [1, 2, 3, 5, 8, 13, 1000])
def test_decoder_splits_anywhere(step):
    payload = ROLE + token("a") + USAGE
    body = chunk(payload[:31]) + chunk(payload[31:]) + b"0;ext=1\r\nTrailer: x\r\n\r\n"
    decoder = ChunkedBody(None, _Raw(), None, None)
    out = b"".join(decoder._decode(body[i:i + step]) for i in range(0, len(body), step))
    assert out == payload and decoder.done and not decoder._extra


def test_decoder_notices_bytes_after_the_body():
    decoder = ChunkedBody(None, _Raw(), None, None)
    assert decoder._decode(chunk(b"x") + END + b"HTTP/1.1") == b"x"
    assert decoder.done and decoder._extra


def test_ticks_count_once_per_call():
    ticks = Ticks()
    assert [ticks() for _ in itertools.repeat(None, 3)] == [1.0, 2.0, 3.0]


def test_abort_after_n_chunks_stops_at_n_even_when_more_arrived_in_the_same_read(scripted):
    server, ticks = scripted([HEAD, chunk(ROLE + token("a")), R, chunk(token("b")) + chunk(token("c")), R, 1.0])
    record = RequestRecord(request_id="req-1", worker="local", profile="abort", scheduled_unix=0.0)
    session = user_session(f"http://127.0.0.1:{server.port}")
    spec = RequestSpec(path="/v1/chat/completions", body={"stream": True}, name="chat", max_tokens=3)
    text = run_request(session, spec, record, StreamSettings(timeout_s=5, abort_after_tokens=2), 0.0, clock=ticks)
    assert record.outcome is Outcome.ABORTED and text == "ab" and record.num_chunks == 2
    assert len(record.itl_s) == 1
