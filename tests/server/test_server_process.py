"""llmserve as a process: SIGTERM drains and exits 0, a crashed engine exits non-zero, bad flags stop it."""

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from engine.server.cli import UsageError, build_parser, configs_from_args, main, parse_size, run

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawn(*flags: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "engine.server", "--port", str(port), *flags], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180  # a loaded CI machine can take a while to import torch
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"llmserve did not become ready: {proc.communicate()[1][-2000:]}")


def _stream(url: str, max_tokens: int, out: dict, key: str, started: threading.Event) -> None:
    """A chat stream: its first event (the role) arrives once admitted, before any token."""
    body = {"model": "builtin", "messages": [{"role": "user", "content": "drain me"}], "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}
    out[key] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                out[key].append(line[6:])
                started.set()


def test_sigterm_drains_running_streams_then_exits_zero():
    proc, url = _spawn("--drain-timeout", "5", "--max-model-len", "4096")
    out: dict = {}
    threads = []
    try:
        # The long stream cannot finish within the drain timeout; the short one needs a few steps.
        for key, max_tokens in (("long", 4000), ("short", 16)):
            started = threading.Event()
            threads.append(threading.Thread(target=_stream, args=(url, max_tokens, out, key, started)))
            threads[-1].start()
            assert started.wait(60), f"the {key} stream never started"
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while httpx.get(url + "/ready").status_code != 503:
            assert time.monotonic() < deadline, "readiness never turned false"
            time.sleep(0.02)
        refused = httpx.post(url + "/v1/completions", json={"model": "builtin", "prompt": "late", "max_tokens": 1})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready"
        for t in threads:
            t.join(timeout=60)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert out["short"][-1] == "[DONE]" and json.loads(out["short"][-2])["choices"][0]["finish_reason"] == "length"
    assert out["long"][-1] == "[DONE]" and json.loads(out["long"][-2])["error"]["code"] == "draining"
    logs = [json.loads(line) for line in proc.stdout.read().splitlines()]
    (shutdown,) = [r for r in logs if r["event"] == "engine.shutdown"]
    assert (shutdown["reason"], shutdown["drained"], shutdown["aborted"]) == ("sigterm", 1, 1)
    assert [r["reason"] for r in logs if r["event"] == "request.aborted"] == ["drain"]


def test_client_leaving_and_a_second_sigterm_are_logged_as_what_they_are():
    """A non-streaming client that leaves, then SIGTERM twice: stderr holds only the listening line."""
    proc, url = _spawn("--drain-timeout", "30", "--max-model-len", "4096")
    out: dict = {}
    try:
        body = {"model": "builtin", "prompt": "leave", "max_tokens": 4000, "ignore_eos": True}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json=body, timeout=1.0)
        started = threading.Event()
        thread = threading.Thread(target=_stream, args=(url, 4000, out, "long", started))
        thread.start()
        assert started.wait(60), "the stream never started"
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while httpx.get(url + "/ready").status_code != 503:
            assert time.monotonic() < deadline, "readiness never turned false"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)  # stop now: the drain (30 s) is not waited for
        thread.join(timeout=60)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    stdout, stderr = proc.communicate()
    port = url.rsplit(":", 1)[1]
    assert stderr.splitlines() == [f"llmserve: listening on http://127.0.0.1:{port} (model builtin)"]
    assert out["long"][-1] == "[DONE]" and json.loads(out["long"][-2])["error"]["code"] == "shutdown"
    logs = [json.loads(line) for line in stdout.splitlines()]
    assert [r["reason"] for r in logs if r["event"] == "request.aborted"] == ["client_disconnect", "shutdown"]
    (shutdown,) = [r for r in logs if r["event"] == "engine.shutdown"]
    assert (shutdown["reason"], shutdown["drained"], shutdown["aborted"]) == ("sigterm", 0, 1)


def test_injected_crash_logs_fatal_error_and_exits_non_zero(tmp_path):
    """The command's own run() in a thread (main() only adds sys.exit): its exit code is 1."""
    log_file, port, result = tmp_path / "llmserve.log", _free_port(), {}
    thread = threading.Thread(target=lambda: result.setdefault("code", run(
        ["--port", str(port), "--fault-crash-after-requests", "1", "--log-file", str(log_file)])))
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while not log_file.exists() or "engine.startup" not in log_file.read_text():
        assert time.monotonic() < deadline and thread.is_alive(), "llmserve never started"
        time.sleep(0.05)
    while True:
        try:
            response = httpx.post(url + "/v1/completions", json={"model": "builtin", "prompt": "bye", "max_tokens": 2})
            break
        except httpx.TransportError:
            time.sleep(0.05)
    assert response.status_code == 200
    thread.join(timeout=60)
    assert result["code"] == 1
    logs = [json.loads(line) for line in log_file.read_text().splitlines()]
    (error,) = [r for r in logs if r["event"] == "engine.error"]
    assert error["fatal"] is True and error["exc_type"] == "FatalEngineError" and error["phase"] == "step"
    assert [r["reason"] for r in logs if r["event"] == "engine.shutdown"] == ["fatal"]


def test_capacity_refusal_logs_and_exits_1(tmp_path, capsys):
    log_file = tmp_path / "llmserve.log"
    code = run(["--num-kv-blocks", "4", "--max-model-len", "512", "--log-file", str(log_file)])
    assert code == 1
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and line.startswith("llmserve: error: To serve at least one request with the model's")
    (record,) = [json.loads(x) for x in log_file.read_text().splitlines()]
    assert record["event"] == "engine.error" and record["phase"] == "startup" and record["fatal"] is True
    assert record["exc_type"] == "CapacityError" and "estimated maximum model length is 64" in record["message"]


@pytest.mark.parametrize("argv, fragment", [
    (["--kv-cache-memory", "2GiB", "--num-kv-blocks", "10"], "choose one KV budget"),
    (["--gpu-memory-utilization", "0.9"], "needs --device cuda"),
    (["--kv-cache-memory", "lots"], "not a size"),
    (["--max-num-seqs", "0"], "must be positive"),
    (["--log-format", "xml"], "invalid choice"),
    (["--device", "tpu"], "--device must be"),
    (["--no-such-flag"], "unrecognized arguments"),
])
def test_bad_flags_are_one_clear_line(argv, fragment):
    with pytest.raises(UsageError, match=fragment):
        configs_from_args(build_parser().parse_args(argv))


def test_bad_flag_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--max-queue-len", "-1"])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "llmserve: error: argument --max-queue-len: must be positive: '-1'"]


@pytest.mark.parametrize("text, expected", [
    ("2GiB", 2 << 30), ("512MiB", 512 << 20), ("1.5G", 3 << 29), ("1000000", 1000000), ("64k", 65536),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_taken_port_is_one_line_before_loading(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as info:
            main(["--port", str(port)])
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"llmserve: error: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_ctrl_c_is_logged_as_sigint():
    """Ctrl-C (SIGINT) drains as SIGTERM does; engine.shutdown names the signal that came."""
    proc, url = _spawn()
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    logs = [json.loads(line) for line in proc.stdout.read().splitlines()]
    (shutdown,) = [r for r in logs if r["event"] == "engine.shutdown"]
    assert (shutdown["reason"], shutdown["drained"], shutdown["aborted"]) == ("sigint", 0, 0)
