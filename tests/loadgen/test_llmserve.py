"""Client TTFT against llmserve's own: every request paired by id with the server's log, and its histogram."""

import csv
import json
import socket
import threading
import time

import pytest
import requests
from fidelity_harness import Server, start_behind_nginx
from locust_harness import read_summary, run_locust

from loadgen.report import REQUESTS_CSV

pytest.importorskip("engine.server.builder")

from engine.core.config import EngineConfig  # noqa: E402
from engine.core.faults import FaultConfig  # noqa: E402
from engine.obs.logs import EventLogger, LogFormat  # noqa: E402
from engine.server.builder import build_state, load_engine, start_state, stop_state  # noqa: E402
from engine.server.runner import make_server  # noqa: E402
from engine.server.state import ServerConfig  # noqa: E402

# Every engine step sleeps this long first (the test-only slow-step fault), so consecutive tokens leave the
# engine at least STEP_S apart. A client TTFT within one step of the server's means the client saw the
# first token before the engine could have produced the next: an ordering, not a latency budget.
STEP_S = 0.25


class Lines:
    """A text stream keeping the server's JSON log lines."""

    def __init__(self):
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self.lines.extend(line for line in text.splitlines() if line)
        return len(text)

    def flush(self) -> None:
        pass

    def events(self, name: str) -> list[dict]:
        with self._lock:
            return [e for e in map(json.loads, self.lines) if e["event"] == name]


@pytest.fixture
def llmserve():
    logs = Lines()
    log = EventLogger("builtin", logs, LogFormat.JSON)
    state = build_state(load_engine(EngineConfig(max_model_len=1024, num_kv_blocks=512,
                                                 faults=FaultConfig(step_delay_s=STEP_S)), log), ServerConfig(),
                        log, None)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = make_server(state, "127.0.0.1", sock.getsockname()[1])
    start_state(state)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", logs
    server.should_exit = True
    thread.join(20)
    stop_state(state, "sigterm")


def histogram(url: str, name: str) -> tuple[float, float]:
    total, count = 0.0, 0.0
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "_sum{"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_count{"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


def test_client_ttft_matches_llmserve_ttft(llmserve, tmp_path):
    url, logs = llmserve
    proc = run_locust(["--host", url, "--report-dir", str(tmp_path), "-u", "2", "-r", "2", "-t", "3s",
                       "--prompt-tokens", "48", "--output-tokens", "6"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = read_summary(tmp_path)
    assert s["model"] == "builtin" and s["num_succeeded"] >= 2 and s["num_failed"] == 0
    rows = list(csv.DictReader(open(tmp_path / REQUESTS_CSV)))
    # Every token counted: the server's usage on every row, each ask met (ignore_eos), no row left out.
    assert len(rows) == s["num_requests"] and {r["outcome"] for r in rows} == {"ok"}
    assert {(r["output_tokens"], r["output_tokens_source"]) for r in rows} == {("6", "usage")}
    finished = {e["request_id"]: e for e in logs.events("request.finished")}
    assert {r["response_id"] for r in rows} <= set(finished)
    client = {r["response_id"]: float(r["ttft_s"]) for r in rows}
    server = {rid: finished[rid]["ttft_s"] for rid in client}
    # The server's clock starts after the request arrived and stops at the first token, before it is
    # written: the client's TTFT (first visible text) is never shorter. It is longer by the HTTP and
    # SSE overhead, plus the wait for the next token when the detokenizer held the first one back (a
    # partial UTF-8 byte of the builtin byte-level tokenizer shows no text until completed).
    for r in rows:
        rid = r["response_id"]
        gap = client[rid] - server[rid]
        assert gap > -0.002, (r, finished[rid])
        if r["num_chunks"] == r["output_tokens"]:  # no token held back: seen before the next was made
            assert gap < STEP_S, (r, finished[rid])
        else:  # first text came before the server finished
            assert gap < finished[rid]["e2e_s"] - server[rid] + STEP_S, (r, finished[rid])
    # The histogram saw every streamed request plus the one calibration probe (max_tokens 1).
    ttft_sum, ttft_count = histogram(url, "llm_time_to_first_token_seconds")
    assert ttft_count == len(client) + 1
    probe_ttft = sum(e["ttft_s"] for rid, e in finished.items() if rid not in client)
    assert ttft_sum - probe_ttft == pytest.approx(sum(server.values()), abs=1e-3)
    assert sum(client.values()) > ttft_sum - probe_ttft


def test_llmserve_through_nginx_with_two_processes(llmserve, tmp_path):
    """Locust's --processes 2 (a master, two workers) against llmserve behind nginx, proxy_buffering off:
    one report over both workers, every request and token accounted for."""
    url, logs = llmserve
    upstream = Server("llmserve", url, [], url)
    gateway = start_behind_nginx(upstream, tmp_path)
    try:
        proc = run_locust(["--host", gateway.url, "--report-dir", str(tmp_path / "rep"), "--processes", "2",
                           "-u", "4", "-r", "4", "-t", "3s", "--prompt-tokens", "16", "--output-tokens", "4"],
                          tmp_path)
    finally:
        gateway.stop()
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = read_summary(tmp_path / "rep")
    rows = list(csv.DictReader(open(tmp_path / "rep" / REQUESTS_CSV)))
    assert {r["worker"] for r in rows} == {"worker-0", "worker-1"}
    assert len(rows) == s["num_requests"] == s["num_succeeded"] > 0
    assert {(r["output_tokens"], r["output_tokens_source"]) for r in rows} == {("4", "usage")}
    finished = {e["request_id"] for e in logs.events("request.finished")}
    assert {r["response_id"] for r in rows} <= finished
    # Each of the two workers probed once (max_tokens 1); every other request the engine finished is a row.
    assert len(finished) == len(rows) + 2
