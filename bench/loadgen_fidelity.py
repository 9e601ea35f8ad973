"""Load generator fidelity: loadgen/chat.py beside a plain reference locustfile, against servers on
other HTTP stacks, at 1, 20 and 100 users.

Each server streams on a known schedule (first content token 150 ms after the request, then one
every 20 ms, 32 tokens; tests/loadgen/schedule_servers.py): the standard library's
ThreadingHTTPServer (chunked), aiohttp.web, starlette under uvicorn, the standard library one behind
nginx (`proxy_buffering off`), and llmserve itself (its built-in model: no fixed schedule, so only
the comparison with the reference). For every server and user count the reference
(bench/reference/plain_locustfile.py: HttpUser, post(stream=True), iter_lines()) and loadgen run one after the
other, the same length, in alternating order. Printed per row: TTFT, ITL and TPOT p50 and p99 of
loadgen minus the schedule and minus the reference, both request counts, each client's CPU per
request (start-up and report included) and each client's drift (its TTFT p50 minus the server's own
TTFT p50 over the same streams: what the client added). Targets: p50 within
2 ms of the reference, p99 within 20 ms, counts within 5%. Last line: one JSON object.

    python bench/loadgen_fidelity.py [--quick] [--run-time-s 8] [--servers stdlib,aiohttp] [--users 1,20,100]
"""

import argparse
import csv
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "loadgen"))
sys.path.insert(0, str(REPO))

from fidelity_harness import (  # noqa: E402
    Server,
    run_loadgen,
    run_reference,
    start_behind_nginx,
    start_schedule_server,
    wait_ready,
)

TTFT_MS, ITL_MS, NUM_TOKENS = 150.0, 20.0, 32
LLMSERVE_TOKENS = 8  # the built-in model on CPU: 32 tokens for 100 users outlast a short run
TARGET_P50_MS, TARGET_P99_MS, TARGET_COUNT = 2.0, 20.0, 0.05
REFERENCE_PROMPT = "tell me a story"  # bench/reference/plain_locustfile.py's
SERVERS = ("stdlib", "aiohttp", "starlette", "nginx", "llmserve")


def start_llmserve() -> Server:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [str(Path(sys.executable).parent / "llmserve"), "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", "sched-model", "--max-num-seqs", "128", "--torch-threads", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/v1/models", proc, timeout_s=180)
    return Server("llmserve", url, [proc], url)


def start(kind: str, workdir: Path) -> Server:
    if kind == "llmserve":
        return start_llmserve()
    if kind == "nginx":
        upstream = start_schedule_server("stdlib", TTFT_MS, ITL_MS, NUM_TOKENS)
        try:
            return start_behind_nginx(upstream, workdir)
        except BaseException:
            upstream.stop()
            raise
    return start_schedule_server(kind, TTFT_MS, ITL_MS, NUM_TOKENS)


def loadgen_samples(run: tuple[Path, float]) -> dict:
    report, cpu_s = run
    rows = [r for r in csv.DictReader(open(report / "loadgen_requests.csv")) if r["outcome"] == "ok"]
    return {"count": len(rows), "cpu_s": cpu_s, "ttft": [float(r["ttft_s"]) for r in rows],
            "itl": [float(g) for r in rows for g in r["itl_s"].split()],
            "tpot": [float(r["tpot_s"]) for r in rows if r["tpot_s"]],
            "failed": sum(1 for r in csv.DictReader(open(report / "loadgen_requests.csv")) if r["outcome"] == "failed")}


def reference_samples(run: tuple[list[dict], float]) -> dict:
    results, cpu_s = run
    return {"count": len(results), "cpu_s": cpu_s, "ttft": [r["ttft_s"] for r in results],
            "itl": [g for r in results for g in r["itl_s"]],
            "tpot": [sum(r["itl_s"]) / (r["num_tokens"] - 1) for r in results if r["num_tokens"] > 1], "failed": 0}


def pct_ms(values: list[float], p: float) -> float | None:
    return float(np.percentile(values, p)) * 1000 if values else None


def compare(lg: dict, ref: dict, scheduled: bool) -> dict:
    row = {"loadgen_requests": lg["count"], "reference_requests": ref["count"], "loadgen_failed": lg["failed"],
           "count_ratio": lg["count"] / ref["count"] if ref["count"] else None,
           "loadgen_cpu_ms_per_request": 1000 * lg["cpu_s"] / lg["count"] if lg["count"] else None,
           "reference_cpu_ms_per_request": 1000 * ref["cpu_s"] / ref["count"] if ref["count"] else None}
    schedule = {"ttft": TTFT_MS, "itl": ITL_MS, "tpot": ITL_MS}
    ok = row["count_ratio"] is not None and abs(row["count_ratio"] - 1) <= TARGET_COUNT and not lg["failed"]
    for metric in ("ttft", "itl", "tpot"):
        for p in (50, 99):
            mine, theirs = pct_ms(lg[metric], p), pct_ms(ref[metric], p)
            row[f"{metric}_p{p}_ms"] = mine
            row[f"{metric}_p{p}_minus_schedule_ms"] = mine - schedule[metric] if scheduled and mine is not None else None
            diff = mine - theirs if mine is not None and theirs is not None else None
            row[f"{metric}_p{p}_minus_reference_ms"] = diff
            limit = TARGET_P50_MS if p == 50 else TARGET_P99_MS
            ok = ok and diff is not None and abs(diff) <= limit
    row["meets_targets"] = ok
    return row


def fmt(value: float | None) -> str:
    return "     -" if value is None else f"{value:+6.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="stdlib and nginx at 1 and 20 users, 4 s runs")
    parser.add_argument("--run-time-s", type=float, default=8.0)
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--users", default="1,20,100")
    args = parser.parse_args()
    servers = ["stdlib", "nginx"] if args.quick else args.servers.split(",")
    levels = [1, 20] if args.quick else [int(u) for u in args.users.split(",")]
    run_time_s = 4.0 if args.quick else args.run_time_s
    rows, load_before = [], os.getloadavg()
    print("server       users  lg/ref n      TTFT p50 -sched -ref  p99 -ref | ITL p50 -sched -ref  p99 -ref | "
          "TPOT p50 -ref  p99 -ref | CPU ms/req lg ref | drift lg ref", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "reference-prompt.json"
        dataset.write_text(json.dumps([{"conversations": [{"from": "human", "value": REFERENCE_PROMPT},
                                                          {"from": "gpt", "value": "a story"}]}]))
        for kind in servers:
            server = start(kind, Path(tmp) / kind)
            try:
                for i, users in enumerate(levels):
                    work = Path(tmp) / f"{kind}-{users}"
                    work.mkdir(parents=True)
                    order = ("reference", "loadgen") if i % 2 == 0 else ("loadgen", "reference")
                    samples = {}
                    tokens = LLMSERVE_TOKENS if kind == "llmserve" else NUM_TOKENS
                    server_ttft = {}
                    for client in order:
                        seen = len(server.stats()["server_ttft_s"]) if kind != "llmserve" else 0
                        if client == "reference":
                            os.environ["LOADGEN_REFERENCE_TOKENS"] = str(tokens)
                            samples[client] = reference_samples(run_reference(server.url, users, run_time_s, work))
                        else:  # the reference's very prompt (llmserve's prefix cache then serves both alike)
                            samples[client] = loadgen_samples(run_loadgen(server.url, users, run_time_s, work,
                                                                          tokens, ["--dataset", str(dataset)]))
                        time.sleep(1.0)  # the server's last streams end before the next run starts
                        if kind != "llmserve":  # the server's own TTFT over this client's streams
                            server_ttft[client] = server.stats()["server_ttft_s"][seen:]
                    row = {"server": server.kind, "users": users,
                           **compare(samples["loadgen"], samples["reference"], kind != "llmserve")}
                    for client, values in server_ttft.items():  # client drift: client TTFT minus the server's
                        mine = pct_ms(samples[client]["ttft"], 50)
                        own = pct_ms(values, 50)
                        row[f"server_ttft_p50_ms_{client}"] = own
                        row[f"{client}_drift_p50_ms"] = mine - own if mine is not None and own is not None else None
                    rows.append(row)
                    print(f"{server.kind:12s} {users:5d} {row['loadgen_requests']:5d}/{row['reference_requests']:<5d} "
                          f"{fmt(row['ttft_p50_minus_schedule_ms'])} {fmt(row['ttft_p50_minus_reference_ms'])} "
                          f"{fmt(row['ttft_p99_minus_reference_ms'])} | {fmt(row['itl_p50_minus_schedule_ms'])} "
                          f"{fmt(row['itl_p50_minus_reference_ms'])} {fmt(row['itl_p99_minus_reference_ms'])} | "
                          f"{fmt(row['tpot_p50_minus_reference_ms'])} {fmt(row['tpot_p99_minus_reference_ms'])} | "
                          f"{fmt(row['loadgen_cpu_ms_per_request'])} {fmt(row['reference_cpu_ms_per_request'])} | "
                          f"{fmt(row.get('loadgen_drift_p50_ms'))} {fmt(row.get('reference_drift_p50_ms'))}"
                          f"  {'ok' if row['meets_targets'] else 'MISSES'}", flush=True)
            finally:
                server.stop()
    print(json.dumps({"all_meet_targets": all(r["meets_targets"] for r in rows),
                      "num_rows_meeting_targets": sum(r["meets_targets"] for r in rows), "num_rows": len(rows),
                      "targets": {"p50_ms": TARGET_P50_MS, "p99_ms": TARGET_P99_MS, "count_ratio": TARGET_COUNT},
                      "schedule": {"ttft_ms": TTFT_MS, "itl_ms": ITL_MS, "tokens": NUM_TOKENS},
                      "run_time_s": run_time_s, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                      "cpu_count": os.cpu_count(), "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
