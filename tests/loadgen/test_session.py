"""loadgen.session.post sends what HttpSession.post sends and reports it to Locust the same way, from a
prepared request it reuses only while nothing in the session could change it."""

import socket
import socketserver
import threading

import gevent
import pytest
import requests

from loadgen import session as loadgen_session
from loadgen.session import TEMPLATE_ATTR, post, settle_environment
from tests.loadgen.conftest import user_session

BODY = {"model": "m", "messages": [{"role": "user", "content": "héllo"}], "max_tokens": 3, "stream": True}
ANSWER = b'{"choices": [{"message": {"content": "hi"}}]}'


class Capture(socketserver.ThreadingTCPServer):
    """Keeps each request's raw head and body; answers 200 with a JSON body (keep-alive)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, set_cookie: bool = False):
        self.requests: list[tuple[list[str], bytes]] = []
        self.set_cookie = set_cookie
        super().__init__(("127.0.0.1", 0), CaptureHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class CaptureHandler(socketserver.StreamRequestHandler):
    def handle(self):
        while True:
            head = []
            line = self.rfile.readline()
            if not line:
                return
            while line not in (b"\r\n", b""):
                head.append(line.decode().rstrip("\r\n"))
                line = self.rfile.readline()
            length = next(int(h.split(":", 1)[1]) for h in head if h.lower().startswith("content-length:"))
            self.server.requests.append((head, self.rfile.read(length)))
            cookie = b"Set-Cookie: sticky=a1; Path=/\r\n" if self.server.set_cookie else b""
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(ANSWER)).encode() + b"\r\n" + cookie + b"\r\n" + ANSWER)


@pytest.fixture
def server():
    srv = Capture()
    yield srv
    srv.shutdown()
    srv.server_close()


def send(session, request_id: str, name: str = "chat", stream: bool = False):
    with post(session, "/v1/chat/completions", BODY, {"x-request-id": request_id, "Authorization": "Bearer k"},
              name, stream, (5, 5)) as resp:
        resp.success()
        return resp


def without_id(head: list[str]) -> list[str]:
    return [h for h in head if not h.lower().startswith("x-request-id")]


def test_reused_request_is_byte_for_byte_what_requests_prepares(server):
    events: list = []
    reference = user_session(server.url, events, settle=False)
    reference.trust_env = False
    with reference.post("/v1/chat/completions", json=BODY, headers={"x-request-id": "r0", "Authorization": "Bearer k"},
                        name="chat", catch_response=True, timeout=(5, 5)) as resp:
        resp.success()
    fast = user_session(server.url, events)
    send(fast, "r1")
    send(fast, "r2")
    assert len(fast.__dict__[TEMPLATE_ATTR]) == 1  # prepared once, sent twice
    (head0, body0), (head1, body1), (head2, body2) = server.requests
    assert body0 == body1 == body2 == requests.Request("POST", server.url, json=BODY).prepare().body
    assert without_id(head0) == without_id(head1) == without_id(head2)
    assert [h for h in head1 + head2 if h.lower().startswith("x-request-id")] == ["x-request-id: r1",
                                                                                   "x-request-id: r2"]
    # Locust sees the same event: type, name, url, length, no exception
    keys = ("request_type", "name", "url", "response_length", "exception", "context")
    assert [tuple(e[k] for k in keys) for e in events] == [
        ("POST", "chat", server.url + "/v1/chat/completions", len(ANSWER), None, {})] * 3


def test_session_changes_are_honoured(server):
    events: list = []
    session = user_session(server.url, events)
    send(session, "r1")
    session.headers["X-Tenant"] = "blue"  # a template made before this must not be reused
    send(session, "r2")
    session.cookies.set("sticky", "b2")  # a cookie jar with something in it: requests' own path
    send(session, "r3")
    heads = [head for head, _ in server.requests]
    assert "X-Tenant: blue" not in heads[0] and "X-Tenant: blue" in heads[1] and "X-Tenant: blue" in heads[2]
    assert [h for h in heads[2] if h.startswith("Cookie:")] == ["Cookie: sticky=b2"]


def test_cookies_set_by_the_server_are_sent_back():
    srv = Capture(set_cookie=True)
    try:
        events: list = []
        session = user_session(srv.url, events)
        send(session, "r1")
        send(session, "r2")
        heads = [head for head, _ in srv.requests]
        assert not [h for h in heads[0] if h.startswith("Cookie:")]
        assert [h for h in heads[1] if h.startswith("Cookie:")] == ["Cookie: sticky=a1"]
    finally:
        srv.shutdown()
        srv.server_close()


def test_connection_error_is_reported_as_httpsession_reports_it():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    events: list = []
    session = user_session(f"http://127.0.0.1:{port}", events)
    with post(session, "/v1/chat/completions", BODY, {"x-request-id": "r1"}, "chat", True, (2, 2)) as resp:
        assert resp.status_code == 0 and isinstance(resp.error, requests.exceptions.ConnectionError)
    reference = user_session(session.base_url, events, settle=False)
    reference.trust_env = False
    with reference.post("/v1/chat/completions", json=BODY, headers={"x-request-id": "r1"}, name="chat",
                        stream=True, catch_response=True, timeout=(2, 2)) as resp:
        assert resp.status_code == 0 and isinstance(resp.error, requests.exceptions.ConnectionError)
    ours, theirs = ((e["request_type"], e["name"], e["url"], e["response_length"], type(e["exception"]),
                     str(e["exception"])) for e in events)
    assert ours == theirs and ours[:2] == ("POST", "chat")


def test_settle_environment_keeps_what_the_environment_says(monkeypatch, tmp_path):
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "ca.pem"))
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine api.example login alice password s3cret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    proxied = requests.Session()
    settle_environment(proxied, "http://api.example/v1")
    assert proxied.trust_env is False
    assert proxied.proxies == {"http": "http://proxy.example:3128", "no": "internal.example"}  # as requests merges
    assert proxied.auth == ("alice", "s3cret")
    assert proxied.verify == str(tmp_path / "ca.pem")
    bypassed = requests.Session()
    settle_environment(bypassed, "http://internal.example/v1")
    assert bypassed.proxies == {} and bypassed.auth is None


def test_liveness_check_of_a_pooled_connection_does_not_switch_greenlets():
    a, b = socket.socketpair()
    try:
        ran = []
        gevent.spawn(ran.append, 1)  # would run if the check yielded to the hub
        assert loadgen_session._wait_for_read(a, timeout=0.0) is False and ran == []
        b.sendall(b"x")
        assert loadgen_session._wait_for_read(a, timeout=0.0) is True and ran == []
        gevent.sleep(0)
        assert ran == [1]
    finally:
        a.close()
        b.close()
