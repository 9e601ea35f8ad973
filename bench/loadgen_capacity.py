"""Load generator capacity: concurrent streams one Locust process, and `--processes 2`, sustain with
an accurate TTFT.

A mock SSE server (its own process) injects TTFT and ITL; `locust -f loadgen/chat.py --headless`
runs N users for each N in turn, first as one process, then as `--processes 2` (Locust's own
master and two workers, one report merged from both). The client's drift is its median TTFT minus
the server's own (the injected TTFT plus the server's measured lateness in writing the first
token), so a slow server is not blamed on the client. max_streams_per_process is the largest N
whose client drift stays under 5 ms with one process, max_streams_2_processes the same with two;
each level also says whether Locust warned that a client process was CPU-bound. A 1-user run comes
first: its drift is the fixed cost of this machine. Last line: one JSON object.

    python bench/loadgen_capacity.py --quick
"""

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
LOCUST = Path(sys.executable).parent / "locust"
MAX_DRIFT_MS = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mock(port: int, ttft_ms: float, itl_ms: float, num_tokens: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "loadgen.mockserver", "--port", str(port), "--ttft-ms",
                             str(ttft_ms), "--itl-ms", str(itl_ms), "--output-tokens", str(num_tokens)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            requests.get(f"http://127.0.0.1:{port}/stats", timeout=1)
            return proc
        except requests.exceptions.ConnectionError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the mock server did not start")


def run_level(port: int, users: int, duration_s: int, num_tokens: int, report_dir: Path, processes: int = 1) -> dict:
    requests.get(f"http://127.0.0.1:{port}/stats", timeout=10)  # drain the previous level's lags
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [str(LOCUST), "-f", str(REPO / "loadgen" / "chat.py"), "--headless", "--only-summary",
           "--host", f"http://127.0.0.1:{port}", "-u", str(users), "-r", str(users), "-t", f"{duration_s}s",
           "--stop-timeout", "10", "--prompt-tokens", "16", "--output-tokens", str(num_tokens),
           "--report-dir", str(report_dir), *(["--processes", str(processes)] if processes > 1 else [])]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=duration_s + 120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"locust exited {proc.returncode}: {proc.stderr[-500:]}")
    summary = json.loads((report_dir / "loadgen_summary.json").read_text())
    lags = requests.get(f"http://127.0.0.1:{port}/stats", timeout=10).json()["first_token_lag_s"]
    return {"users": users, "processes": processes, "requests": summary["num_succeeded"],
            "failed": summary["num_failed"], "client_cpu_warning": summary.get("client_cpu_warning", False),
            "client_loop_lag_p99_ms": (summary.get("client_loop_lag_p99_s") or 0.0) * 1000,
            "ttft_p50_ms": summary["ttft_s"]["p50"] * 1000, "ttft_p90_ms": summary["ttft_s"]["p90"] * 1000,
            "itl_p50_ms": summary["itl_s"]["p50"] * 1000,
            "server_lag_p50_ms": statistics.median(lags) * 1000 if lags else 0.0, "locust_cpu_s": cpu_s}


def sweep(port: int, args, levels: list[int], duration_s: int, processes: int) -> tuple[list[dict], int]:
    """Every level in turn; the largest N such that every level up to N stayed under the limit."""
    results, best = [], 0
    for users in levels:
        with tempfile.TemporaryDirectory() as tmp:
            level = run_level(port, users, duration_s, args.output_tokens, Path(tmp), processes)
        level["drift_ms"] = level["ttft_p50_ms"] - args.ttft_ms
        level["client_drift_ms"] = level["drift_ms"] - level["server_lag_p50_ms"]
        results.append(level)
        print(f"processes={processes} users={users:4d} requests={level['requests']:6d} "
              f"ttft_p50={level['ttft_p50_ms']:.2f} ms server_lag={level['server_lag_p50_ms']:.2f} ms "
              f"client_drift={level['client_drift_ms']:.2f} ms cpu_warning={level['client_cpu_warning']} "
              f"loop_lag_p99={level['client_loop_lag_p99_ms']:.1f} ms",
              flush=True)
        if level["failed"]:
            break
        if all(r["client_drift_ms"] < MAX_DRIFT_MS for r in results):
            best = users
    return results, best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two small levels, short runs (CI)")
    parser.add_argument("--ttft-ms", type=float, default=100.0)
    parser.add_argument("--itl-ms", type=float, default=50.0)
    parser.add_argument("--output-tokens", type=int, default=10)
    parser.add_argument("--levels", default="50,100,200,300,400,600")
    parser.add_argument("--duration-s", type=int, default=10)
    args = parser.parse_args()
    levels = [1, 10] if args.quick else [1, *(int(x) for x in args.levels.split(","))]
    duration_s = 4 if args.quick else args.duration_s
    port = free_port()
    load_before = os.getloadavg()
    mock = start_mock(port, args.ttft_ms, args.itl_ms, args.output_tokens)
    try:
        one, best_one = sweep(port, args, levels, duration_s, 1)
        two, best_two = sweep(port, args, levels, duration_s, 2)
    finally:
        mock.terminate()
        mock.wait(10)
    print(json.dumps({"max_streams_per_process": best_one, "max_streams_2_processes": best_two,
                      "ratio_2_processes_to_1": best_two / best_one if best_one else None,
                      "max_client_drift_ms": MAX_DRIFT_MS, "injected_ttft_ms": args.ttft_ms,
                      "injected_itl_ms": args.itl_ms, "output_tokens": args.output_tokens,
                      "duration_s": duration_s, "cpu_count": os.cpu_count(), "loadavg_before": load_before,
                      "loadavg_after": os.getloadavg(), "levels_1_process": one, "levels_2_processes": two}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
