"""The llm-gpu-exporter command: a real run on this GPU-less machine, bad arguments, clean shutdown."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml

from exporters.cli import ExporterConfig, main, run

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, deadline: float) -> str:
    """GET with retries while the server starts; the deadline bounds the wait, it asserts nothing."""
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _value(text: str, series: str) -> float:
    [line] = [ln for ln in text.splitlines() if ln.startswith(series + " ")]
    return float(line.split()[-1])


def _command() -> list[str]:
    script = Path(sys.executable).parent / "llm-gpu-exporter"
    return [str(script)] if script.exists() else [sys.executable, "-m", "exporters.cli"]


def test_real_run_without_nvml_serves_nvml_down_retries_and_exits_0_on_sigterm() -> None:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        _command() + ["--port", str(port), "--nvml-retry-interval", "0.1", "--xid-wait-ms", "20"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        url = f"http://127.0.0.1:{port}/metrics"
        first = _get(url, deadline)
        assert _value(first, "llm_gpu_nvml_up") == 0.0
        assert _value(first, 'llm_gpu_collector_success{collector="nvml"}') == 0.0
        assert "llm_gpu_up{" not in first and "llm_gpu_nvml_info" not in first
        failures = 0.0
        while failures < 3 and time.monotonic() < deadline:  # retries keep coming, the process keeps serving
            failures = _value(_get(url, deadline), 'llm_gpu_nvml_init_attempts_total{result="failure"}')
        assert failures >= 3
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    unavailable = [ln for ln in err.splitlines() if "NVML unavailable" in ln]
    assert len(unavailable) == 1, err  # one line, not one per retry
    assert unavailable[0].endswith(
        "NVML unavailable: NVML Shared Library Not Found (code 12); "
        "serving llm_gpu_nvml_up 0, retrying every 0.1s"
    )
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "http"], "argument --port: not a port number: 'http'"),
        (["--port", "70000"], "argument --port: port 70000 out of range 0-65535"),
        (
            ["--nvml-retry-interval", "0"],
            "argument --nvml-retry-interval: must be a positive number of seconds, got '0'",
        ),
        (
            ["--nvml-retry-interval", "nan"],
            "argument --nvml-retry-interval: must be a positive number of seconds, got 'nan'",
        ),
        (["--xid-wait-ms", "0"], "argument --xid-wait-ms: must be at least 1 ms, got 0"),
        (
            ["--log-level", "loud"],
            "argument --log-level: invalid choice: 'loud' (choose from ",
        ),  # quoting varies
        (["--verbose"], "unrecognized arguments: --verbose"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"llm-gpu-exporter: error: {message}")
    assert captured.err.count("\n") == 1 and captured.err.endswith("\n")


def _run_in_thread(
    config: ExporterConfig, nvml: FakeNvml
) -> tuple[threading.Thread, threading.Event, list[int]]:
    stop, codes = threading.Event(), []
    thread = threading.Thread(target=lambda: codes.append(run(config, nvml, stop)), daemon=True)
    thread.start()
    return thread, stop, codes


def test_run_serves_fake_gpus_and_shuts_nvml_down_on_stop() -> None:
    nvml = FakeNvml([FakeGpu(uuid="GPU-0"), FakeGpu(uuid="GPU-1", name="NVIDIA L4")])
    port = _free_port()
    config = ExporterConfig(port=port, xid_wait_ms=20, process_metrics=False, nvml_timeout_s=60.0)
    thread, stop, codes = _run_in_thread(config, nvml)
    try:
        text = _get(f"http://127.0.0.1:{port}/metrics", time.monotonic() + 30)
    finally:
        stop.set()
        thread.join(30)
    assert codes == [0]
    assert _value(text, "llm_gpu_nvml_up") == 1.0
    assert _value(text, 'llm_gpu_up{gpu="1",name="NVIDIA L4",uuid="GPU-1"}') == 1.0
    assert "llm_gpu_process_memory_used_bytes" not in text
    assert (nvml.num_init, nvml.num_shutdown, nvml.initialized) == (1, 1, False)
    assert all(event_set.freed for event_set in nvml.event_sets)


def test_port_in_use_is_one_line_and_exit_1(caplog) -> None:
    nvml = FakeNvml([FakeGpu(uuid="GPU-0")])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert run(ExporterConfig(port=port), nvml, threading.Event()) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [f"cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert nvml.num_shutdown == 1
