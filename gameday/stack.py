"""The serving stack of one game day: engine replicas, GPU exporter, nginx and Prometheus."""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gameday import drill
from gameday.nginx import GatewayConfig
from gameday.nginx import start_gateway as start_gateway_proc
from gameday.procs import Proc, ProcSpec, Supervisor, free_port, wait_http_ok, wait_until
from gameday.prom import PromClient, PromConfig, start_prometheus

REPO_ROOT = Path(__file__).resolve().parents[1]
ENGINE_READY_TIMEOUT_S = 120.0  # CPU start-up on a busy 2-core machine: model init + warm-up


def python_entry(module: str, func: str = "main") -> list[str]:
    """argv that runs module.func() with this interpreter, whether or not the console script is installed."""
    return [sys.executable, "-c", f"import sys; from {module} import {func}; sys.exit({func}())"]


def child_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{path}" if path else str(REPO_ROOT),
            "PYTHONUNBUFFERED": "1"}


@dataclass(slots=True)
class Stack:
    sup: Supervisor
    report_dir: Path
    engines: list[Proc] = field(default_factory=list)
    engine_addrs: list[str] = field(default_factory=list)
    gateway_port: int = 0
    prom: PromClient | None = None
    prom_url: str = ""
    workdir: tempfile.TemporaryDirectory | None = None

    @property
    def logs_dir(self) -> Path:
        return self.report_dir / "logs"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def close(self) -> None:
        self.sup.close()
        if self.workdir is not None:
            self.workdir.cleanup()


def start_engine(stack: Stack, index: int, flags: list[str], engine: str = "llmserve") -> Proc:
    port = free_port()
    # JSON log lines go to logs/ (what triage reads); stdout/stderr (tracebacks before logging is
    # set up) to procs/.
    stack.logs_dir.mkdir(parents=True, exist_ok=True)
    if engine == "vllm":  # vLLM logs to stdout and stderr only: that text is its log
        from gameday.vllm import start_vllm

        proc = start_vllm(stack.sup, f"engine-{index}", port, flags, stack.logs_dir / f"engine-{index}.log")
        stack.engines.append(proc)
        stack.engine_addrs.append(f"127.0.0.1:{port}")
        return proc
    argv = [*python_entry("engine.server.cli"), "--host", "127.0.0.1", "--port", str(port),
            "--log-file", str(stack.logs_dir / f"engine-{index}.log"), *flags]
    out_path = stack.report_dir / "procs" / f"engine-{index}.out"
    proc = stack.sup.start(ProcSpec(name=f"engine-{index}", argv=argv, log_path=out_path,
                                    env=child_env(), cwd=REPO_ROOT))
    stack.engines.append(proc)
    stack.engine_addrs.append(f"127.0.0.1:{port}")
    return proc


def wait_engines_ready(stack: Stack, engine: str = "llmserve") -> None:
    for proc, addr in zip(stack.engines, stack.engine_addrs, strict=True):
        if engine == "vllm":
            from gameday.vllm import wait_vllm_ready

            wait_vllm_ready(proc, addr)
        else:
            wait_http_ok(f"http://{addr}/ready", proc, ENGINE_READY_TIMEOUT_S)


def wait_engine_exit(proc: Proc, timeout_s: float = ENGINE_READY_TIMEOUT_S) -> int:
    """For a scenario whose engine must refuse to start: wait for it to exit, return the code."""
    wait_until(lambda: not proc.alive(), None, timeout_s, f"{proc.name} to exit")
    return proc.returncode if proc.returncode is not None else 0


def nvml_answers() -> bool:
    """Whether this machine's NVML initialises and sees a GPU (as the exporter would read it)."""
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    try:
        return pynvml.nvmlDeviceGetCount() > 0
    except pynvml.NVMLError:
        return False
    finally:
        pynvml.nvmlShutdown()


def start_exporter(stack: Stack, fake_gpu: bool) -> str | None:
    """The GPU exporter: on this machine's real NVML, or over the tests' fake NVML (gameday.fake_gpu)
    with fake_gpu or where NVML sees no GPU: a real exporter there serves llm_gpu_nvml_up 0, which
    LLMGPUNVMLDown rightly pages on. None if the exporter is not installed."""
    if importlib.util.find_spec("exporters.cli") is None:
        return None
    port = free_port()
    module = "gameday.fake_gpu" if fake_gpu or not nvml_answers() else "exporters.cli"
    argv = [*python_entry(module), "--host", "127.0.0.1", "--port", str(port)]
    proc = stack.sup.start(ProcSpec(name="gpu-exporter", argv=argv, env=child_env(), cwd=REPO_ROOT,
                                    log_path=stack.report_dir / "procs" / "gpu-exporter.log"))
    wait_http_ok(f"http://127.0.0.1:{port}/metrics", proc, 30.0)
    return f"127.0.0.1:{port}"


def start_gateway(stack: Stack, read_timeout_s: float, buffering: bool) -> None:
    """nginx in front of every engine replica. With buffering on it also compresses event streams
    and ignores the engine's `X-Accel-Buffering: no` (that header alone keeps the stream flowing):
    a common gateway config in front of an engine that sends no such header (vLLM sends none)."""
    assert stack.workdir is not None
    stack.gateway_port = free_port()
    gw = GatewayConfig(upstreams=stack.engine_addrs, listen_port=stack.gateway_port,
                       proxy_read_timeout_s=read_timeout_s, proxy_buffering=buffering,
                       ignore_accel_buffering=buffering, gzip_event_stream=buffering)
    start_gateway_proc(stack.sup, gw, Path(stack.workdir.name) / "nginx", stack.logs_dir / "nginx")


def start_prometheus_stack(stack: Stack, fake_gpu: bool) -> None:
    """The GPU exporter, then Prometheus over the engines, the exporter and the drill rules."""
    assert stack.workdir is not None
    rules = drill.write_drill_copies(drill.shipped_rule_files(REPO_ROOT), stack.report_dir / "drill-rules")
    exporter = start_exporter(stack, fake_gpu)
    cfg = PromConfig(listen_port=free_port(), engine_targets=stack.engine_addrs,
                     exporter_targets=[exporter] if exporter else [], rule_files=rules)
    _, stack.prom = start_prometheus(stack.sup, cfg, Path(stack.workdir.name) / "tsdb",
                                     stack.report_dir / "prometheus")
    stack.prom_url = stack.prom.base_url


def new_stack(report_dir: Path) -> Stack:
    report_dir.mkdir(parents=True, exist_ok=True)
    return Stack(sup=Supervisor(), report_dir=report_dir,
                 workdir=tempfile.TemporaryDirectory(prefix="gameday-"))
