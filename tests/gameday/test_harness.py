"""Harness parts against the real programs: process groups, nginx proxying a stream, Prometheus."""

import http.server
import os
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from gameday import busy, drill
from gameday.errors import ProcessDiedError
from gameday.nginx import GatewayConfig, start_gateway
from gameday.procs import ProcSpec, Supervisor, free_port, wait_http_ok
from gameday.prom import PromConfig, start_prometheus

needs_nginx = pytest.mark.skipif(shutil.which("nginx") is None and not shutil.os.path.exists("/usr/sbin/nginx"),
                                 reason="nginx not installed (make system-deps)")
needs_prom = pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")


class _StreamUpstream(http.server.BaseHTTPRequestHandler):
    """Sends chunk 0 with the headers, chunk 1 a moment later, then waits for the test's go-ahead
    (or stalls) before the end."""

    protocol_version = "HTTP/1.1"
    release = threading.Event()

    def do_GET(self):  # noqa: N802 (http.server's naming)
        # As uvicorn does: chunked for an HTTP/1.1 request, delimited by close for HTTP/1.0.
        self.chunked = self.request_version == "HTTP/1.1"
        if not self.chunked:
            self.protocol_version = "HTTP/1.0"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding" if self.chunked else "Connection", "chunked" if self.chunked else "close")
        self.send_header("X-Accel-Buffering", "no")  # as llmserve sends it
        self.end_headers()
        self._chunk(b"data: 0\n\n")
        time.sleep(0.3)  # chunk 1 reaches nginx in a read of its own, after the header's
        self._chunk(b"data: 1\n\n")
        self.release.wait(timeout=10)
        self._chunk(b"data: [DONE]\n\n")
        if self.chunked:
            self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)
        self.wfile.flush()

    def log_message(self, *args):
        pass


@pytest.fixture()
def upstream():
    _StreamUpstream.release = threading.Event()
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _StreamUpstream)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    _StreamUpstream.release.set()
    srv.shutdown()
    srv.server_close()


def _raw_get(port: int, path: str, gzip: bool = False) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    accept = "Accept-Encoding: gzip\r\n" if gzip else ""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: gw\r\n{accept}Connection: close\r\n\r\n".encode())
    return sock


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, data = data.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2:]
    return out


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _gone_or_zombie(pid: int) -> bool:
    try:
        status = open(f"/proc/{pid}/status").read()
    except FileNotFoundError:
        return True
    return re.search(r"^State:\s+Z", status, re.M) is not None


def test_supervisor_kills_the_whole_process_group(tmp_path):
    script = "import subprocess, time; print(subprocess.Popen(['sleep', '300']).pid, flush=True); time.sleep(300)"
    log = tmp_path / "p.log"
    with Supervisor() as sup:
        proc = sup.start(ProcSpec(name="parent", argv=[sys.executable, "-c", script], log_path=log))
        while not log.read_text().strip():
            time.sleep(0.05)
        grandchild = int(log.read_text())
    assert not proc.alive()
    time.sleep(0.2)
    assert _gone_or_zombie(grandchild)  # the grandchild `sleep` got the group's signal too


def test_wait_reports_a_dead_child_with_its_log(tmp_path):
    with Supervisor() as sup:
        proc = sup.start(ProcSpec(name="dies", argv=[sys.executable, "-c", "print('boom'); raise SystemExit(3)"],
                                  log_path=tmp_path / "d.log"))
        with pytest.raises(ProcessDiedError, match=r"dies exited with code 3 .*\n.*boom"):
            wait_http_ok(f"http://127.0.0.1:{free_port()}/", proc, timeout_s=20)


@needs_nginx
def test_nginx_proxies_a_stream_unbuffered_and_logs_upstreaminfo(tmp_path, upstream):
    up_addr = f"127.0.0.1:{upstream.server_address[1]}"
    port = free_port()
    with Supervisor() as sup:
        start_gateway(sup, GatewayConfig(upstreams=[up_addr], listen_port=port), tmp_path / "prefix", tmp_path / "logs")
        sock = _raw_get(port, "/v1/chat/completions")
        # The upstream holds the end until released: chunk 1 arriving first proves no buffering.
        head = _read_until(sock, b"data: 1")
        assert b"data: 1" in head and b"[DONE]" not in head
        _StreamUpstream.release.set()
        assert b"data: [DONE]" in _read_until(sock, b"[DONE]")
        sock.close()
        time.sleep(0.2)
    line = (tmp_path / "logs" / "access.log").read_text().splitlines()[-1]
    match = re.fullmatch(
        r'127\.0\.0\.1 - - \[[^\]]+\] "GET /v1/chat/completions HTTP/1\.1" 200 (\d+) "-" "-" \d+ ([\d.]+) '
        r"\[llm-engine\] \[\] (\S+) \d+ ([\d.]+) 200 [0-9a-f]{32}", line)
    assert match, line
    assert match.group(3) == up_addr
    assert "proxy_buffering off;" in (tmp_path / "logs" / "nginx.conf").read_text()


@needs_nginx
def test_nginx_buffering_ignoring_x_accel_holds_the_stream_back(tmp_path, upstream):
    port = free_port()
    cfg = GatewayConfig(upstreams=[f"127.0.0.1:{upstream.server_address[1]}"], listen_port=port,
                        proxy_buffering=True, ignore_accel_buffering=True, gzip_event_stream=True)
    with Supervisor() as sup:
        start_gateway(sup, cfg, tmp_path / "prefix", tmp_path / "logs")
        sock = _raw_get(port, "/v1/chat/completions", gzip=True)
        sock.settimeout(1.5)
        held = b""
        with pytest.raises(TimeoutError):  # chunk 1 sits in nginx's buffer while the upstream holds on
            while True:
                held += sock.recv(4096)
        assert held == b""  # not even the headers: they leave with the first compressed output
        _StreamUpstream.release.set()
        sock.settimeout(10)
        body = held + _read_until(sock, b"[DONE]")
        sock.close()
    assert b"Content-Encoding: gzip" in body
    assert zlib.decompress(_dechunk(body.split(b"\r\n\r\n", 1)[1]), 16 + zlib.MAX_WBITS) == (
        b"data: 0\n\ndata: 1\n\ndata: [DONE]\n\n")
    conf = (tmp_path / "logs" / "nginx.conf").read_text()
    assert "proxy_buffering on;" in conf and "proxy_ignore_headers X-Accel-Buffering;" in conf
    assert "gzip_types text/event-stream application/json;" in conf


@needs_nginx
def test_nginx_read_timeout_logs_the_real_error_line(tmp_path, upstream):
    port = free_port()
    cfg = GatewayConfig(upstreams=[f"127.0.0.1:{upstream.server_address[1]}"], listen_port=port,
                        proxy_read_timeout_s=0.5)
    with Supervisor() as sup:
        start_gateway(sup, cfg, tmp_path / "prefix", tmp_path / "logs")
        sock = _raw_get(port, "/stall")
        body = _read_until(sock, b"\r\n0\r\n\r\n")  # never comes: nginx cuts the stream
        sock.close()
        time.sleep(0.2)
    assert b"data: 0" in body and b"[DONE]" not in body
    errors = (tmp_path / "logs" / "error.log").read_text()
    assert "upstream timed out (110: Connection timed out) while reading upstream" in errors
    assert 'request: "GET /stall HTTP/1.1"' in errors


@needs_prom
def test_prometheus_loads_drill_rules_and_fires_engine_down(tmp_path):
    src = tmp_path / "down.rules.yml"
    src.write_text(
        "groups:\n- name: t\n  rules:\n  - alert: LLMEngineDown\n    expr: up{job=\"llm-engine\"} == 0\n"
        "    for: 2m\n    labels: {severity: critical}\n")
    rules = drill.write_drill_copies([src], tmp_path / "drill")
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: up == 0
    cfg = PromConfig(listen_port=free_port(), engine_targets=[dead], rule_files=rules)
    with Supervisor() as sup:
        started = time.time()
        _, client = start_prometheus(sup, cfg, tmp_path / "tsdb", tmp_path / "logs")
        (group,) = client.rule_groups()
        assert group["rules"][0]["duration"] == 10.0  # 2m / 60 is 2s: a target-down alert keeps 10s
        deadline = time.monotonic() + 60
        while not [a for a in client.alerts() if a.state == "firing"] and time.monotonic() < deadline:
            time.sleep(0.5)
        (alert,) = client.alerts()
        (series,) = client.query_range('up{job="llm-engine"}', started, time.time(), step_s=1.0)
        load = busy.measure(client, time.time() - started, timeout_s=1.0, interval_s=1.0)
    assert (alert.name, alert.state, alert.labels["instance"]) == ("LLMEngineDown", "firing", dead)
    assert {value for _, value in series["values"]} == {"0"}
    # nothing listens: every scrape is refused at once, none runs into the timeout; that is a target
    # down, not a busy machine, so an unexpected LLMEngineDown here would be the alert logic's fault
    (target,) = [t for t in load.targets if t.job == "llm-engine"]
    assert target.scrapes >= 10 and target.failed == target.scrapes and target.timed_out == 0
    assert load.rule_iterations >= 10 and load.rule_failures == 0
    failure = f"unexpected alert fired: LLMEngineDown on {dead} at +11.0s"
    assert busy.judge([failure], load, {"LLMEngineDown"})[0] == busy.FAIL


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_harness_stops_its_children(tmp_path, signum):
    """Ctrl-C (SIGINT) or SIGTERM to the harness: the with-block still stops every child."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from gameday.procs import ProcSpec, Supervisor, install_signal_handlers\n"
        "install_signal_handlers()\n"
        "with Supervisor() as sup:\n"
        f"    p = sup.start(ProcSpec(name='s', argv=['sleep', '300'], log_path=Path({str(tmp_path)!r}) / 's.log'))\n"
        "    print(p.pid, flush=True)\n"
        "    time.sleep(300)\n"
    )
    # As a terminal's Ctrl-C finds it: SIGINT not ignored. A process started with SIGINT ignored (from
    # a background job of a shell without job control, or nohup) passes that on, and Python then
    # leaves SIGINT ignored instead of raising KeyboardInterrupt: the harness would never see it.
    harness = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                               cwd=Path(__file__).resolve().parents[2],
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    child = int(harness.stdout.readline())
    harness.send_signal(signum)
    assert harness.wait(timeout=20) != 0
    assert _gone_or_zombie(child)  # the harness waited for it before it exited


def test_a_child_runs_on_the_cpus_and_at_the_nice_value_its_spec_asks(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    base = os.getpriority(os.PRIO_PROCESS, 0)
    with Supervisor() as sup:
        proc = sup.start(ProcSpec(name="placed", argv=["sleep", "30"], log_path=tmp_path / "log",
                                  cpus=frozenset({cpu}), nice=base + 5))
        assert os.sched_getaffinity(proc.pid) == {cpu}
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == base + 5
        autogroup = Path(f"/proc/{proc.pid}/autogroup")
        if autogroup.exists():  # its own session: its own autogroup, at the same nice value
            assert autogroup.read_text().split()[-1] == str(base + 5)
            assert proc.placement == f"on CPUs {cpu}, nice {base + 5} (and its session's autogroup)"
        else:
            assert proc.placement == f"on CPUs {cpu}, nice {base + 5}"
        plain = sup.start(ProcSpec(name="plain", argv=["sleep", "30"], log_path=tmp_path / "log2"))
        assert plain.placement == ""
