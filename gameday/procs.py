"""Process supervision: start children on loopback ports, wait until ready, always tear down."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gameday.errors import ProcessDiedError, ReadyTimeoutError

_LIVE: dict[int, subprocess.Popen] = {}


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bind port 0, read it back, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(slots=True)
class ProcSpec:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    # CPUs the child may run on (os.sched_setaffinity right after it starts, before its interpreter
    # has started a thread: every thread it starts inherits them); None: wherever the OS puts it
    cpus: frozenset[int] | None = None
    nice: int | None = None  # a nice value for the child (negative: ahead of others; see prioritize)


@dataclass(slots=True)
class Proc:
    spec: ProcSpec
    popen: subprocess.Popen
    started_ts: float
    stopped_by_us: bool = False
    placement: str = ""  # where it runs and at what priority, when the spec asked (for the timeline)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, num_lines: int = 20) -> str:
        try:
            lines = self.spec.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-num_lines:])

    def signal(self, signum: int) -> None:
        """Send a signal to the child's whole process group (its own session)."""
        if self.alive():
            try:
                os.killpg(self.popen.pid, signum)
            except ProcessLookupError:
                pass

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the group, then SIGKILL after timeout_s; returns the exit code."""
        self.stopped_by_us = True
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(timeout=5)
        _LIVE.pop(self.popen.pid, None)
        return self.popen.returncode


def _kill_all_live() -> None:
    """atexit backstop: nothing started here outlives the interpreter."""
    for pid, popen in list(_LIVE.items()):
        if popen.poll() is None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _LIVE.pop(pid, None)


atexit.register(_kill_all_live)


@dataclass(slots=True)
class Supervisor:
    """Owns every child of one scenario; `close()` (or the with-block) stops them all."""

    procs: list[Proc] = field(default_factory=list)

    def start(self, spec: ProcSpec) -> Proc:
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(spec.env or {})
        with open(spec.log_path, "ab") as log:
            popen = subprocess.Popen(
                spec.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=spec.cwd, start_new_session=True,
            )
        _LIVE[popen.pid] = popen
        proc = Proc(spec=spec, popen=popen, started_ts=time.monotonic())
        self.procs.append(proc)
        placed = []
        if spec.cpus is not None:
            os.sched_setaffinity(popen.pid, spec.cpus)
            placed.append(f"on CPUs {','.join(map(str, sorted(spec.cpus)))}")
        if spec.nice is not None:
            placed.append(prioritize(popen.pid, spec.nice))
        proc.placement = ", ".join(placed)
        return proc

    def close(self) -> None:
        # Reverse order: load generator first, engine last, so the gateway logs the cut-off.
        for proc in reversed(self.procs):
            if proc.alive():
                proc.stop()
            _LIVE.pop(proc.pid, None)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prioritize(pid: int, nice: int) -> str:
    """Give a process the nice value `nice`; says what took. With autogroups (Linux's default,
    /proc/sys/kernel/sched_autogroup_enabled) the CPU is shared between sessions first, and a
    process's own nice ranks it only within its session: a child in a session of its own gets the
    session's nice (/proc/PID/autogroup, sched(7)) too. A negative value needs CAP_SYS_NICE;
    without it the child runs at its normal priority and the text says why."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError as exc:
        return f"at its normal priority (nice {nice} refused: {exc.strerror or exc})"
    autogroup = Path(f"/proc/{pid}/autogroup")
    if not autogroup.exists():  # a kernel without autogroups: the process's nice is all there is
        return f"nice {nice}"
    try:
        autogroup.write_text(str(nice))
    except OSError as exc:
        return f"nice {nice}, its session's autogroup not ({exc.strerror or exc})"
    return f"nice {nice} (and its session's autogroup)"


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    """GET url; returns (status, body); connection errors raise OSError."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_until(check: Callable[[], bool], proc: Proc | None, timeout_s: float, what: str,
               interval_s: float = 0.2) -> float:
    """Poll check() until true; raise if proc dies or timeout_s passes. Returns seconds waited."""
    start = time.monotonic()
    while True:
        if proc is not None and not proc.alive():
            raise ProcessDiedError(
                f"{proc.name} exited with code {proc.returncode} while waiting for {what}; "
                f"log tail:\n{proc.log_tail()}")
        try:
            if check():
                return time.monotonic() - start
        except OSError:
            pass
        if time.monotonic() - start > timeout_s:
            raise ReadyTimeoutError(f"{what}: not ready after {timeout_s:.0f}s")
        time.sleep(interval_s)


def wait_http_ok(url: str, proc: Proc | None, timeout_s: float) -> float:
    """Wait until GET url answers 200."""
    return wait_until(lambda: http_get(url)[0] == 200, proc, timeout_s, f"GET {url}")


def install_signal_handlers() -> None:
    """Turn SIGTERM/SIGHUP into SystemExit so every finally-block (teardown) runs."""
    def _raise(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise)
