"""Start the schedule servers (tests/loadgen/schedule_servers.py), nginx in front of one, and Locust
runs of loadgen/chat.py and of the plain reference locustfile; shared by the fidelity tests and
bench/loadgen_fidelity.py."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

REPO = Path(__file__).resolve().parents[2]
LOCUST = Path(sys.executable).parent / "locust"
SERVERS = Path(__file__).resolve().parent / "schedule_servers.py"
REFERENCE = REPO / "bench" / "reference" / "plain_locustfile.py"

NGINX_CONF = """daemon off;
master_process off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/tmp;
    proxy_temp_path {prefix}/tmp;
    fastcgi_temp_path {prefix}/tmp;
    uwsgi_temp_path {prefix}/tmp;
    scgi_temp_path {prefix}/tmp;
    upstream schedule {{ server 127.0.0.1:{upstream}; keepalive 256; }}
    server {{
        listen 127.0.0.1:{port} backlog=1024;
        location / {{
            proxy_pass http://schedule;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A server process (and, for `nginx`, the upstream behind it), stopped by `stop`."""

    kind: str
    url: str
    procs: list[subprocess.Popen]
    stats_url: str

    def stats(self) -> dict:
        return requests.get(self.stats_url + "/stats", timeout=10).json()

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            requests.get(url, timeout=2)
            return
        except requests.exceptions.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up") from None
            time.sleep(0.1)


def start_schedule_server(kind: str, ttft_ms: float, itl_ms: float, num_tokens: int,
                          keep_sends: bool = True) -> Server:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVERS), kind, "--port", str(port), "--ttft-ms", str(ttft_ms),
                             "--itl-ms", str(itl_ms), "--tokens", str(num_tokens), *([] if keep_sends else ["--no-sends"])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/v1/models", proc)
    return Server(kind, url, [proc], url)


def start_behind_nginx(upstream: Server, workdir: Path) -> Server:
    """Debian's nginx, `proxy_buffering off`, HTTP/1.1 with keep-alive to the upstream."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    prefix = workdir / "nginx"
    (prefix / "tmp").mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = prefix / "nginx.conf"
    conf.write_text(NGINX_CONF.format(prefix=prefix, upstream=upstream.url.rsplit(":", 1)[1], port=port))
    proc = subprocess.Popen([nginx, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/v1/models", proc)
    return Server(f"nginx+{upstream.kind}", url, upstream.procs + [proc], upstream.stats_url)


SAMPLE_S = 0.25  # how often a run's CPU is read while it runs


@dataclass
class CpuUse:
    """CPU of one Locust run (user + system, its processes together): all of it, start-up and report
    included, and readings while it ran, to tell the CPU spent while streams ran."""

    total_s: float
    samples: list[tuple[float, float]] = field(default_factory=list)  # (wall clock, CPU seconds so far)

    def at(self, unix: float) -> float:
        """CPU seconds spent by `unix`, interpolated between the readings around it."""
        if not self.samples:
            return 0.0
        before = [s for s in self.samples if s[0] <= unix]
        after = [s for s in self.samples if s[0] >= unix]
        if not before:
            return self.samples[0][1]
        if not after:
            return self.samples[-1][1]
        (t0, c0), (t1, c1) = before[-1], after[0]
        return c0 if t1 == t0 else c0 + (c1 - c0) * (unix - t0) / (t1 - t0)

    def between(self, start_unix: float, end_unix: float) -> float:
        return self.at(end_unix) - self.at(start_unix)


@dataclass
class LocustRun:
    proc: subprocess.CompletedProcess
    cpu: CpuUse


def _tree_cpu_s(proc: psutil.Process) -> float | None:
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for p in procs:
        try:
            times = p.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def run_locust(locustfile: Path, host: str, users: int, run_time_s: float, cwd: Path, extra: list[str],
               env_extra: dict | None = None, timeout_s: float = 180) -> LocustRun:
    """One Locust run; its CPU is read every SAMPLE_S while it runs and, at its end, from the kernel's
    account of the process and the children it waited for (os.wait4: runs of several clients at once
    are told apart)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           **(env_extra or {})}
    cmd = [str(LOCUST), "-f", str(locustfile), "--headless", "--only-summary", "--host", host, "-u", str(users),
           "-r", str(users), "-t", f"{round(run_time_s)}s", "--stop-timeout", "5", *extra]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        popen = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True)
        watched = psutil.Process(popen.pid)
        samples: list[tuple[float, float]] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(SAMPLE_S):
                cpu = _tree_cpu_s(watched)
                if cpu is not None:
                    samples.append((time.time(), cpu))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        killer = threading.Timer(timeout_s, popen.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(popen.pid, 0)
        finally:
            killer.cancel()
            done.set()
            sampler.join()
        popen.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        proc = subprocess.CompletedProcess(cmd, popen.returncode, out.read(), err.read())
    total = usage.ru_utime + usage.ru_stime
    samples.append((time.time(), total))
    return LocustRun(proc, CpuUse(total, samples))


def run_loadgen(host: str, users: int, run_time_s: float, workdir: Path, num_tokens: int,
                extra: list[str] = ()) -> tuple[Path, CpuUse]:
    """loadgen/chat.py; returns its report folder and the CPU it took."""
    report = Path(tempfile.mkdtemp(prefix="loadgen-", dir=workdir)) / "report"
    run = run_locust(REPO / "loadgen" / "chat.py", host, users, run_time_s, workdir,
                     ["--output-tokens", str(num_tokens), "--prompt-tokens", "16", "--report-dir", str(report),
                      *extra])
    if run.proc.returncode != 0:
        raise RuntimeError(f"loadgen exited {run.proc.returncode}: {run.proc.stderr[-2000:]}")
    return report, run.cpu


def run_reference(host: str, users: int, run_time_s: float, workdir: Path,
                  extra: list[str] = (), env_extra: dict | None = None) -> tuple[list[dict], CpuUse]:
    """The plain reference locustfile; one dict per finished request (of every process with
    `--processes N` in `extra`), and the CPU it took."""
    out = Path(tempfile.mkdtemp(prefix="reference-", dir=workdir))
    run = run_locust(REFERENCE, host, users, run_time_s, workdir, list(extra),
                     {"LOADGEN_REFERENCE_OUT": str(out / "requests.jsonl"), **(env_extra or {})})
    if run.proc.returncode != 0:
        raise RuntimeError(f"the reference exited {run.proc.returncode}: {run.proc.stderr[-2000:]}")
    # With --processes N Locust's master exits without waiting for a worker still busy (it waits up to
    # 3 s, then stops checking), so a worker's file can come after the run: wait for all N + 1.
    expected = int(extra[extra.index("--processes") + 1]) + 1 if "--processes" in extra else 1
    deadline = time.monotonic() + REFERENCE_FILES_WAIT_S
    while len(paths := reference_files(out)) < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    if len(paths) < expected:
        raise RuntimeError(f"the reference wrote {len(paths)} of {expected} result files")
    return [json.loads(line) for path in paths for line in path.read_text().splitlines()], run.cpu


REFERENCE_FILES_WAIT_S = 60.0


def reference_files(out: Path) -> list[Path]:
    """The reference's finished result files (requests.jsonl.<pid>; not the .tmp being written)."""
    return sorted(p for p in out.glob("requests.jsonl.*") if p.name.rsplit(".", 1)[1].isdigit())
