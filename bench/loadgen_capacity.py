"""Load generator capacity: concurrent streams one Locust process sustains with an accurate TTFT.

A mock SSE server (its own process) injects TTFT and ITL; one Locust process (`locust -f
loadgen/chat.py --headless`) runs N users for each N in turn. The client's drift is its median
TTFT minus the injected TTFT minus the server's own lateness in writing the first token (which
the server measures itself), so a slow server is not blamed on the client. max_streams_per_process
is the largest N whose client drift stays within 5 ms. Last line: one JSON object.

    python bench/loadgen_capacity.py --quick
"""

import argparse
import json
import os
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
TARGET = 200


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


def run_level(port: int, users: int, duration_s: int, num_tokens: int, report_dir: Path) -> dict:
    requests.get(f"http://127.0.0.1:{port}/stats", timeout=10)  # drain the previous level's lags
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [str(LOCUST), "-f", str(REPO / "loadgen" / "chat.py"), "--headless", "--only-summary",
           "--host", f"http://127.0.0.1:{port}", "-u", str(users), "-r", str(users), "-t", f"{duration_s}s",
           "--stop-timeout", "10", "--prompt-tokens", "16", "--output-tokens", str(num_tokens),
           "--report-dir", str(report_dir)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=duration_s + 120)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"locust exited {proc.returncode}: {proc.stderr[-500:]}")
    summary = json.loads((report_dir / "loadgen_summary.json").read_text())
    lags = requests.get(f"http://127.0.0.1:{port}/stats", timeout=10).json()["first_token_lag_s"]
    return {"users": users, "requests": summary["num_succeeded"], "failed": summary["num_failed"],
            "ttft_p50_ms": summary["ttft_s"]["p50"] * 1000, "ttft_p90_ms": summary["ttft_s"]["p90"] * 1000,
            "itl_p50_ms": summary["itl_s"]["p50"] * 1000,
            "server_lag_p50_ms": statistics.median(lags) * 1000 if lags else 0.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two small levels, short runs (CI)")
    parser.add_argument("--ttft-ms", type=float, default=100.0)
    parser.add_argument("--itl-ms", type=float, default=50.0)
    parser.add_argument("--output-tokens", type=int, default=10)
    parser.add_argument("--levels", default="50,100,200,300,400,600,800")
    parser.add_argument("--duration-s", type=int, default=10)
    args = parser.parse_args()
    levels = [10, 50] if args.quick else [int(x) for x in args.levels.split(",")]
    duration_s = 4 if args.quick else args.duration_s
    port = free_port()
    mock = start_mock(port, args.ttft_ms, args.itl_ms, args.output_tokens)
    results, best = [], 0
    try:
        for users in levels:
            with tempfile.TemporaryDirectory() as tmp:
                level = run_level(port, users, duration_s, args.output_tokens, Path(tmp))
            level["drift_ms"] = level["ttft_p50_ms"] - args.ttft_ms
            level["client_drift_ms"] = level["drift_ms"] - level["server_lag_p50_ms"]
            results.append(level)
            print(f"users={users:4d} requests={level['requests']:6d} ttft_p50={level['ttft_p50_ms']:.2f} ms "
                  f"drift={level['drift_ms']:.2f} ms server_lag={level['server_lag_p50_ms']:.2f} ms "
                  f"client_drift={level['client_drift_ms']:.2f} ms", flush=True)
            if level["client_drift_ms"] > MAX_DRIFT_MS or level["failed"]:
                break
            best = users
    finally:
        mock.terminate()
        mock.wait(10)
    print(json.dumps({"max_streams_per_process": best, "target": TARGET, "meets_target": best >= TARGET,
                      "injected_ttft_ms": args.ttft_ms, "injected_itl_ms": args.itl_ms,
                      "output_tokens": args.output_tokens, "max_drift_ms": MAX_DRIFT_MS, "cpu_count": os.cpu_count(),
                      "levels": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
