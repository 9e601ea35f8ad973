"""One streamed request through Locust's HttpSession against the mock server: outcome and kind per fault."""


import pytest

from loadgen.client import RequestSpec, StreamSettings, run_request
from loadgen.clientlog import ClientLog
from loadgen.records import FailureKind, Outcome, RequestRecord, TokenSource
from tests.loadgen.conftest import user_session


def spec(num_tokens: int = 6) -> RequestSpec:
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "one two three"}],
            "max_tokens": num_tokens, "stream": True, "stream_options": {"include_usage": True}}
    return RequestSpec(path="/v1/chat/completions", body=body, name="chat", max_tokens=num_tokens)


def send(port: int, settings: StreamSettings | None = None, log: ClientLog | None = None):
    events = []
    session = user_session(f"http://127.0.0.1:{port}", events)
    record = RequestRecord(request_id="req-1", worker="local", profile="steady", scheduled_unix=0.0)
    import time

    text = run_request(session, spec(), record, settings or StreamSettings(timeout_s=5), time.perf_counter(), log=log)
    return record, text, events


def test_ok_stream_timings_and_usage(mock_server):
    server = mock_server(ttft_s=0.05, itl_s=0.02)
    record, text, events = send(server.port)
    assert record.outcome is Outcome.OK and record.failure_kind is None
    assert text == "".join(f" tok{k}" for k in range(6))
    assert record.num_chunks == 6 and len(record.itl_s) == 5
    assert (record.output_tokens, record.output_tokens_source) == (6, TokenSource.USAGE)
    assert record.prompt_tokens == 3 and record.cached_tokens == 0
    # Server and client share this process's GIL, so only what the mock's absolute schedule (token k due
    # at arrival + 50 ms + k * 20 ms) guarantees is exact: lower bounds, and TPOT by its definition.
    assert record.ttft_s >= 0.048 and record.e2e_s >= 0.05 + 5 * 0.02 - 0.002
    assert record.ttft_s <= record.e2e_s and record.tpot_s == (record.e2e_s - record.ttft_s) / 5
    assert [e["request_type"] for e in events] == ["POST"] and events[0]["exception"] is None


@pytest.mark.parametrize("fault, kind, text", [
    ("cut", FailureKind.STREAM_CUT, "requests.exceptions.ChunkedEncodingError: "),
    ("error", FailureKind.ERROR_EVENT, "openai.APIError: CUDA out of memory (injected)"),
    ("http503", FailureKind.HTTP_STATUS, "requests.exceptions.HTTPError: 503 Server Error: Service Unavailable"),
    ("nodone", FailureKind.STREAM_CUT, "loadgen.StreamCut: stream closed after 6 content chunks without data"),
])
def test_each_fault_is_a_failure_of_its_kind(mock_server, tmp_path, fault, kind, text):
    server = mock_server(ttft_s=0.01, itl_s=0.005, faults=(fault,))
    log = ClientLog(tmp_path / "client.log")
    record, _, events = send(server.port, log=log)
    log.close()
    assert record.outcome is Outcome.FAILED
    assert record.failure_kind is kind
    assert record.error.startswith(text)
    assert events[0]["exception"].kind is kind
    line = (tmp_path / "client.log").read_text().strip()
    assert f" ERROR loadgen request_id=req-1 kind={kind.value} status=" in line
    assert line.endswith(record.error)


def test_silent_stream_is_a_timeout(mock_server):
    server = mock_server(ttft_s=0.01, itl_s=0.005, faults=("hang",))
    record, _, _ = send(server.port, StreamSettings(timeout_s=0.3))
    assert (record.outcome, record.failure_kind) == (Outcome.FAILED, FailureKind.TIMEOUT)
    assert "Read timed out" in record.error


def test_refused_connection_is_a_connect_error(mock_server):
    server = mock_server()
    server.stop()
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    record, _, events = send(port)
    assert (record.outcome, record.failure_kind) == (Outcome.FAILED, FailureKind.CONNECT_ERROR)
    assert record.error.startswith("requests.exceptions.ConnectionError: ")
    assert "Connection refused" in record.error


def test_abort_closes_after_n_chunks_and_is_not_a_failure(mock_server, tmp_path):
    server = mock_server(ttft_s=0.01, itl_s=0.01)
    log = ClientLog(tmp_path / "client.log", fmt="json")
    record, _, events = send(server.port, StreamSettings(timeout_s=5, abort_after_tokens=2), log=log)
    log.close()
    assert record.outcome is Outcome.ABORTED and record.failure_kind is None
    assert record.num_chunks == 2
    assert events[0]["exception"] is None
    assert '"event": "request.aborted"' in (tmp_path / "client.log").read_text()


def test_without_usage_output_tokens_are_counted_from_chunks(mock_server):
    server = mock_server(ttft_s=0.01, itl_s=0.005, faults=("nousage",))
    record, _, _ = send(server.port)
    assert record.outcome is Outcome.OK
    assert (record.output_tokens, record.output_tokens_source, record.prompt_tokens) == (6, TokenSource.CHUNKS, None)


def test_client_log_lines_are_what_llmtriage_parses(tmp_path):
    parsers = pytest.importorskip("triage.parsers.client")
    record = RequestRecord(request_id="loadgen-x", worker="local", profile="steady", scheduled_unix=0.0,
                           outcome=Outcome.FAILED, failure_kind=FailureKind.STREAM_CUT, http_status=200, end_s=1.2,
                           num_chunks=3, error="requests.exceptions.ChunkedEncodingError: Response ended prematurely")
    log = ClientLog(tmp_path / "c.log")
    log.write(record, now_unix=1795983000.0)
    log.close()
    event = parsers.parse_loadgen_text((tmp_path / "c.log").read_text().strip(), "c.log", 1)
    assert event.kind == "client.stream_cut"
    assert event.fields["elapsed_s"] == 1.2 and event.fields["error"] == record.error


def test_quick_check_reads_a_connection_as_urllib3_does():
    """QuickCheck's `is_connected` gives urllib3's answer: open and idle, then unread bytes, then closed."""
    import socket

    from urllib3.connection import HTTPConnection

    from loadgen.client import QuickCheckHTTPConnection

    with socket.create_server(("127.0.0.1", 0)) as listener:
        conn = QuickCheckHTTPConnection("127.0.0.1", listener.getsockname()[1])
        assert conn.is_connected is False  # no socket yet
        conn.connect()
        peer, _ = listener.accept()
        states = [(conn.is_connected, HTTPConnection.is_connected.fget(conn))]
        peer.sendall(b"x")  # bytes nobody asked for: the connection cannot carry the next request
        import time

        time.sleep(0.05)  # (loopback delivers at once; this only lets the kernel queue it)
        states.append((conn.is_connected, HTTPConnection.is_connected.fget(conn)))
        conn.sock.recv(1)
        peer.close()  # the server closed the kept-alive connection
        time.sleep(0.05)
        states.append((conn.is_connected, HTTPConnection.is_connected.fget(conn)))
        conn.close()
    assert states == [(True, True), (False, False), (False, False)]


QUICK_CHECK_UNDER_GEVENT = """
from gevent import monkey; monkey.patch_all()
import socket, greenlet, gevent
from urllib3.connection import HTTPConnection
from loadgen.client import QuickCheckHTTPConnection
switches, me = [], gevent.getcurrent()
greenlet.settrace(lambda event, args: switches.append(event) if event == "switch" and args[0] is me else None)
listener = socket.create_server(("127.0.0.1", 0))
conn = QuickCheckHTTPConnection("127.0.0.1", listener.getsockname()[1])
conn.connect()
peer, _ = listener.accept()
counts = []
for check in (QuickCheckHTTPConnection.is_connected.fget, HTTPConnection.is_connected.fget):
    switches.clear()
    assert check(conn) is True
    counts.append(len(switches))
print(counts)
"""


def test_under_gevent_the_quick_check_hands_the_loop_to_no_other_greenlet():
    """urllib3's check of a kept-alive connection, under gevent, lets every ready greenlet run before
    the request goes out (gevent's poll switches to the hub even with no timeout); QuickCheck's not."""
    import subprocess
    import sys

    from tests.loadgen.conftest import REPO

    out = subprocess.run([sys.executable, "-c", QUICK_CHECK_UNDER_GEVENT], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    quick, urllib3_own = eval(out.stdout.strip())
    assert quick == 0 and urllib3_own >= 1


ENVIRONMENT_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                         "ALL_PROXY", "NO_PROXY", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NETRC")


@pytest.fixture
def bare_environment(monkeypatch, tmp_path):
    """No proxy, CA bundle or NETRC variable, and a home without .netrc files."""
    import os

    for name in [*ENVIRONMENT_VARIABLES, *(n for n in os.environ if n.lower().endswith("_proxy"))]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_verify_from_environment_reads_what_requests_reads(bare_environment, monkeypatch):
    from loadgen.client import verify_from_environment

    assert verify_from_environment() is True
    monkeypatch.setenv("CURL_CA_BUNDLE", "/curl.pem")
    assert verify_from_environment() == "/curl.pem"
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/requests.pem")  # requests reads it first
    assert verify_from_environment() == "/requests.pem"
    monkeypatch.setenv("no_proxy", "example.com")  # a proxy setting: requests looks per URL
    assert verify_from_environment() is None
    monkeypatch.delenv("no_proxy")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert verify_from_environment() is None
    monkeypatch.delenv("HTTPS_PROXY")
    (bare_environment / ".netrc").write_text("machine example.com login a password b\n")
    assert verify_from_environment() is None
    (bare_environment / ".netrc").unlink()
    monkeypatch.setenv("NETRC", str(bare_environment / "elsewhere"))  # NETRC names the one file looked at
    assert verify_from_environment() == "/requests.pem"
    (bare_environment / "elsewhere").write_text("machine example.com login a password b\n")
    assert verify_from_environment() is None


@pytest.mark.parametrize("bundle", [None, "/requests.pem"])
def test_a_session_reading_the_environment_once_sends_what_one_looking_each_time_sends(bare_environment,
                                                                                       monkeypatch, bundle):
    import requests

    from loadgen.client import read_environment_once, verify_from_environment

    if bundle is not None:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", bundle)
    url = "http://127.0.0.1:8000/v1/chat/completions"
    looking, once = user_session("http://127.0.0.1:8000"), user_session("http://127.0.0.1:8000")
    read_environment_once(once, verify_from_environment())
    assert (looking.trust_env, once.trust_env) == (True, False)
    for verify in (None, False, "/mine.pem"):  # (loadgen's requests set none: None)
        assert (once.merge_environment_settings(url, {}, None, verify, None)
                == looking.merge_environment_settings(url, {}, None, verify, None))
    plain_looking, plain_once = requests.Session(), requests.Session()
    read_environment_once(plain_once, verify_from_environment())
    request = requests.Request("POST", url, json={"a": 1}, headers={"x-request-id": "r"})
    a, b = plain_looking.prepare_request(request), plain_once.prepare_request(request)
    assert (a.url, a.headers, a.body) == (b.url, b.headers, b.body)


def test_a_session_keeps_looking_where_the_environment_depends_on_the_url(bare_environment, monkeypatch):
    from loadgen.client import read_environment_once, verify_from_environment

    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    session = user_session("http://127.0.0.1:8000")
    read_environment_once(session, verify_from_environment())
    assert session.trust_env is True
    assert session.merge_environment_settings("http://example.com/", {}, None, None, None)["proxies"] == {
        "http": "http://proxy:3128"}
