"""Start the schedule servers (tests/loadgen/schedule_servers.py), nginx in front of one, and Locust
runs of loadgen/chat.py and of the plain reference locustfile; shared by the fidelity tests and
bench/loadgen_fidelity.py."""

import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

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


def start_schedule_server(kind: str, ttft_ms: float, itl_ms: float, num_tokens: int) -> Server:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVERS), kind, "--port", str(port), "--ttft-ms", str(ttft_ms),
                             "--itl-ms", str(itl_ms), "--tokens", str(num_tokens)],
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


@dataclass
class LocustRun:
    proc: subprocess.CompletedProcess
    cpu_s: float  # user + system CPU of the Locust process(es), start-up and report included


def run_locust(locustfile: Path, host: str, users: int, run_time_s: float, cwd: Path, extra: list[str],
               env_extra: dict | None = None, timeout_s: float = 180) -> LocustRun:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           **(env_extra or {})}
    cmd = [str(LOCUST), "-f", str(locustfile), "--headless", "--only-summary", "--host", host, "-u", str(users),
           "-r", str(users), "-t", f"{round(run_time_s)}s", "--stop-timeout", "5", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return LocustRun(proc, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime))


def run_loadgen(host: str, users: int, run_time_s: float, workdir: Path, num_tokens: int,
                extra: list[str] = ()) -> tuple[Path, float]:
    """loadgen/chat.py; returns its report folder and the CPU seconds it took."""
    report = Path(tempfile.mkdtemp(prefix="loadgen-", dir=workdir)) / "report"
    run = run_locust(REPO / "loadgen" / "chat.py", host, users, run_time_s, workdir,
                     ["--output-tokens", str(num_tokens), "--prompt-tokens", "16", "--report-dir", str(report),
                      *extra])
    if run.proc.returncode != 0:
        raise RuntimeError(f"loadgen exited {run.proc.returncode}: {run.proc.stderr[-2000:]}")
    return report, run.cpu_s


def run_reference(host: str, users: int, run_time_s: float, workdir: Path,
                  extra: list[str] = ()) -> tuple[list[dict], float]:
    """The plain reference locustfile; one dict per finished request (of every process with
    `--processes N` in `extra`), and the CPU seconds it took."""
    out = Path(tempfile.mkdtemp(prefix="reference-", dir=workdir))
    run = run_locust(REFERENCE, host, users, run_time_s, workdir, list(extra),
                     {"LOADGEN_REFERENCE_OUT": str(out / "requests.jsonl")})
    if run.proc.returncode != 0:
        raise RuntimeError(f"the reference exited {run.proc.returncode}: {run.proc.stderr[-2000:]}")
    return [json.loads(line) for path in sorted(out.glob("requests.jsonl.*"))
            for line in path.read_text().splitlines()], run.cpu_s
