"""The first round at many users: loadgen/chat.py beside the plain reference locustfile, when all
users start at once.

All -u users send their first request at once, each opening its user's connection (its TTFT
includes the connect). Against the standard library schedule server (tests/loadgen/schedule_servers.py:
first token 150 ms after the request, then one every 20 ms, 32 tokens), optionally behind nginx and
with Locust's `--processes N`, the two clients run one after the other, alternating, --rounds times
each. Per run, of the client's first -u requests by start: TTFT p50 and p99, the spread of their
starts (first to last), and the median TTFT of the fifth of them that started first and of the
fifth that started last. Printed per run, then the medians over the rounds per client and their
ratio (loadgen over the reference). `--baseline DIR` adds a third client, loadgen/chat.py of another
checkout (DIR), in the same rotation: a change measured against what it changed. Last line: one
JSON object.

    python bench/loadgen_first_round.py [--users 100] [--rounds 4] [--run-time-s 3] [--nginx] [--processes 2]
        [--baseline DIR]
"""

import argparse
import csv
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "loadgen"))
sys.path.insert(0, str(REPO))

from fidelity_harness import (  # noqa: E402
    run_loadgen,
    run_locust,
    run_reference,
    start_behind_nginx,
    start_schedule_server,
)

TTFT_MS, ITL_MS, NUM_TOKENS = 150.0, 20.0, 32
REFERENCE_PROMPT = "tell me a story"  # bench/reference/plain_locustfile.py's
COLUMNS = ("ttft_p50_ms", "ttft_p99_ms", "start_spread_ms", "first_fifth_ttft_p50_ms", "last_fifth_ttft_p50_ms")


def first_round(rows: list[tuple[float, float]], users: int) -> dict:
    """rows: (start, TTFT in s) of every finished request; the first `users` by start."""
    first = sorted(rows)[:users]
    if len(first) < users:
        raise RuntimeError(f"only {len(first)} finished requests of the first {users}")
    starts = [s for s, _ in first]
    ttft = np.array([t for _, t in first]) * 1000
    fifth = max(1, users // 5)
    return {"ttft_p50_ms": float(np.percentile(ttft, 50)), "ttft_p99_ms": float(np.percentile(ttft, 99)),
            "start_spread_ms": (starts[-1] - starts[0]) * 1000,
            "first_fifth_ttft_p50_ms": float(np.median(ttft[:fifth])),
            "last_fifth_ttft_p50_ms": float(np.median(ttft[-fifth:]))}


def run_once(client: str, url: str, users: int, seconds: float, work: Path, dataset: Path,
             extra: list[str], baseline: Path | None) -> dict:
    if client == "reference":
        results, _ = run_reference(url, users, seconds, work, extra)
        return first_round([(r["start_unix"], r["ttft_s"]) for r in results], users)
    args = ["--dataset", str(dataset), *extra]
    if client == "baseline":
        report = Path(tempfile.mkdtemp(prefix="baseline-", dir=work)) / "report"
        run = run_locust(baseline / "loadgen" / "chat.py", url, users, seconds, work,
                         ["--output-tokens", str(NUM_TOKENS), "--prompt-tokens", "16", "--report-dir", str(report), *args],
                         {"PYTHONPATH": str(baseline)})
        if run.proc.returncode != 0:
            raise RuntimeError(f"the baseline exited {run.proc.returncode}: {run.proc.stderr[-2000:]}")
    else:
        report, _ = run_loadgen(url, users, seconds, work, NUM_TOKENS, args)
    with open(report / "loadgen_requests.csv") as f:
        rows = [(float(r["scheduled_unix"]), float(r["ttft_s"])) for r in csv.DictReader(f) if r["outcome"] == "ok"]
    return first_round(rows, users)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--run-time-s", type=float, default=3.0)
    parser.add_argument("--nginx", action="store_true", help="the schedule server behind nginx")
    parser.add_argument("--processes", type=int, default=1, help="Locust's --processes for both clients")
    parser.add_argument("--baseline", type=Path, help="another checkout whose loadgen/chat.py runs in the rotation too")
    args = parser.parse_args()
    if args.users < 5 or args.rounds < 1 or args.run_time_s < 1 or args.processes < 1:
        parser.error("--users must be at least 5, --rounds and --processes at least 1, --run-time-s at least 1")
    if args.baseline is not None and not (args.baseline / "loadgen" / "chat.py").is_file():
        parser.error(f"--baseline {args.baseline}: no loadgen/chat.py there")
    extra = ["--processes", str(args.processes)] if args.processes > 1 else []
    clients = ("loadgen", "reference") + (("baseline",) if args.baseline is not None else ())
    runs: dict[str, list[dict]] = {client: [] for client in clients}
    load_before = os.getloadavg()
    print("round client     TTFT p50  p99 | start spread | first fifth p50  last fifth p50 (ms)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dataset = work / "reference-prompt.json"
        dataset.write_text(json.dumps([{"conversations": [{"from": "human", "value": REFERENCE_PROMPT},
                                                          {"from": "gpt", "value": "a story"}]}]))
        upstream = start_schedule_server("stdlib", TTFT_MS, ITL_MS, NUM_TOKENS, keep_sends=False)
        servers = [upstream]
        try:
            if args.nginx:
                servers.append(start_behind_nginx(upstream, work))
            url = servers[-1].url
            for i in range(args.rounds):
                order = clients[i % len(clients):] + clients[:i % len(clients)]  # each client first in turn
                for client in order:
                    result = run_once(client, url, args.users, args.run_time_s, work, dataset, extra, args.baseline)
                    runs[client].append(result)
                    print(f"{i + 1:5d} {client:10s} {result['ttft_p50_ms']:8.1f} {result['ttft_p99_ms']:6.1f} | "
                          f"{result['start_spread_ms']:12.1f} | {result['first_fifth_ttft_p50_ms']:15.1f} "
                          f"{result['last_fifth_ttft_p50_ms']:15.1f}", flush=True)
        finally:
            for server in reversed(servers):
                server.stop()
    medians = {client: {c: statistics.median(r[c] for r in results) for c in COLUMNS}
               for client, results in runs.items()}
    ratios = {c: medians["loadgen"][c] / medians["reference"][c] for c in COLUMNS}
    for client in clients:
        m = medians[client]
        print(f"  med {client:10s} {m['ttft_p50_ms']:8.1f} {m['ttft_p99_ms']:6.1f} | {m['start_spread_ms']:12.1f} | "
              f"{m['first_fifth_ttft_p50_ms']:15.1f} {m['last_fifth_ttft_p50_ms']:15.1f}")
    print(f"loadgen / reference: TTFT p50 {ratios['ttft_p50_ms']:.3f}, p99 {ratios['ttft_p99_ms']:.3f}, "
          f"start spread {ratios['start_spread_ms']:.2f}", flush=True)
    print(json.dumps({"users": args.users, "rounds": args.rounds, "nginx": args.nginx, "processes": args.processes,
                      "schedule": {"ttft_ms": TTFT_MS, "itl_ms": ITL_MS, "tokens": NUM_TOKENS},
                      "baseline": str(args.baseline) if args.baseline is not None else None,
                      "median": medians, "loadgen_over_reference": ratios, "runs": runs,
                      "loadavg_before": load_before, "loadavg_after": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
