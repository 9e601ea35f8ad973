"""Load generator fidelity: loadgen/chat.py beside a plain reference locustfile, against servers on
other HTTP stacks, at 1, 20 and 100 users.

Each server streams on a known schedule (first content token 150 ms after the request, then one
every 20 ms, 32 tokens; tests/loadgen/schedule_servers.py): the standard library's
ThreadingHTTPServer (chunked), aiohttp.web, starlette under uvicorn, the standard library one behind
nginx (`proxy_buffering off`), and llmserve itself (its built-in model: no fixed schedule, so only
the comparison with the reference). For every schedule server and user count the reference
(bench/reference/plain_locustfile.py: HttpUser, post(stream=True), iter_lines()) and loadgen run one after the
other, the same length, in alternating order; against llmserve, whose pace moves from run to run,
both run at the same time, each with half the row's users (at least one), and are judged on the
requests that started and ended while both ran. Printed per row: TTFT, ITL and TPOT p50 and p99 of
loadgen minus the schedule and minus the reference, both request counts, each client's CPU per
request (all of it, start-up and report included, and only what it spent while its streams ran) and
each client's drift (its TTFT p50 minus the server's own TTFT p50 over the same streams: what the
client added). Against llmserve TTFT and TPOT are judged per request as the client's minus
llmserve's own (its JSON log, joined by completion id): a stepping server's TTFT moves by a whole
step with when a request lands. Targets: p50 no more than 2 ms above the reference, p99 no more
than 20 ms above, counts (requests within the window, those its edges cut by their share inside)
within 5%; below the reference loadgen must stay within those limits of what the server did (the
schedule; against llmserve 0 for TTFT and TPOT minus its own, and for ITL): between the two, the
reference was the late one. The symmetric verdict (within the limits of the reference either way, every
server) is printed beside it. Last line: one JSON object.

A row `100x2` runs both clients with Locust's `--processes 2`: how a user carries more streams than
one process holds. Each window lasts at least --run-time-s and long enough for about --min-requests
finished requests (one user: about 31 s for 40), each run RUN_MARGIN_S longer, and both clients are
judged on the requests that started and ended within the window from their first request (Locust's
-t cuts the reference's last streams, loadgen lets them finish: neither inside the window).
--rounds N alternates N runs of each client per row and pools them.

    python bench/loadgen_fidelity.py [--quick] [--run-time-s 8] [--min-requests 40] [--rounds 1]
        [--servers stdlib,aiohttp] [--users 1,20,100,100x2]
"""

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "loadgen"))
sys.path.insert(0, str(REPO))

from fidelity_harness import (  # noqa: E402
    Server,
    free_port,
    run_loadgen,
    run_reference,
    start_behind_nginx,
    start_schedule_server,
    wait_ready,
)

TTFT_MS, ITL_MS, NUM_TOKENS = 150.0, 20.0, 32
RUN_MARGIN_S = 2.0  # each run this much longer than the window judged: -t cuts no stream inside it
TOGETHER_SETTLE_S = 2.0  # llmserve rows: the window starts this long after the later client's first request
TOGETHER_MARGIN_S = 5.0 + TOGETHER_SETTLE_S  # llmserve rows: each client's run this much longer than the window
LLMSERVE_ROUNDS = 3  # llmserve rows pool at least this many runs: its pace and the machine's move from run to run
LLMSERVE_TOKENS = 8  # the built-in model on CPU: 32 tokens for 100 users outlast a short run
TARGET_P50_MS, TARGET_P99_MS, TARGET_COUNT = 2.0, 20.0, 0.05
REFERENCE_PROMPT = "tell me a story"  # bench/reference/plain_locustfile.py's
SERVERS = ("stdlib", "aiohttp", "starlette", "nginx", "llmserve")


def start_llmserve(log: Path) -> Server:
    """llmserve with its JSON log in `log`: per request its own TTFT and TPOT (`request.finished`)."""
    port = free_port()
    argv = [str(Path(sys.executable).parent / "llmserve"), "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", "sched-model", "--max-num-seqs", "128", "--torch-threads", "1",
            "--log-format", "json", "--log-file", str(log)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/v1/models", proc, timeout_s=180)
    return Server("llmserve", url, [proc], url)


def start(kind: str, workdir: Path) -> Server:
    if kind == "llmserve":
        workdir.mkdir(parents=True, exist_ok=True)
        return start_llmserve(workdir / "llmserve.log")
    if kind == "nginx":
        upstream = start_schedule_server("stdlib", TTFT_MS, ITL_MS, NUM_TOKENS, keep_sends=False)
        try:
            return start_behind_nginx(upstream, workdir)
        except BaseException:
            upstream.stop()
            raise
    return start_schedule_server(kind, TTFT_MS, ITL_MS, NUM_TOKENS, keep_sends=False)  # (only the tests read them)


def llmserve_own(log: Path) -> dict[str, tuple[float | None, float | None]]:
    """What llmserve measured itself, per completion id: its TTFT and TPOT (its `request.finished` lines)."""
    own = {}
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "request.finished" and event.get("request_id"):
            own[event["request_id"]] = (event.get("ttft_s"), event.get("tpot_s"))
    return own


def loadgen_rows(report: Path) -> tuple[list[dict], int]:
    """loadgen's finished requests in one form with the reference's, and how many failed."""
    every = list(csv.DictReader(open(report / "loadgen_requests.csv")))
    rows = [{"id": r["response_id"], "start": float(r["scheduled_unix"]), "e2e": float(r["e2e_s"]),
             "ttft": float(r["ttft_s"]),
             "itl": [float(g) for g in r["itl_s"].split()], "tpot": float(r["tpot_s"]) if r["tpot_s"] else None}
            for r in every if r["outcome"] == "ok"]
    return rows, sum(1 for r in every if r["outcome"] == "failed")


def reference_rows(results: list[dict]) -> list[dict]:
    return [{"id": r.get("id"), "start": r["start_unix"], "e2e": r["e2e_s"], "ttft": r["ttft_s"], "itl": r["itl_s"],
             "tpot": sum(r["itl_s"]) / (r["num_tokens"] - 1) if r["num_tokens"] > 1 else None} for r in results]


def window_of(rows: list[dict], run_time_s: float) -> tuple[float, float]:
    """From the client's first request to `run_time_s` later: the two clients stop differently
    (Locust's -t cuts the reference's streams in flight; loadgen, under its shape, lets them finish
    within --stop-timeout), so each is counted over the same length of run."""
    first = min((r["start"] for r in rows), default=0.0)
    return first, first + run_time_s


def share_in(row: dict, start: float, end: float) -> float:
    """How much of one request (its start to its last token) lies within [start, end]: 1 inside, 0
    outside, the share inside for one the window's edge cuts."""
    first, last = row["start"], row["start"] + row["e2e"]
    if last <= first:
        return 1.0 if start <= first <= end else 0.0
    return max(0.0, min(last, end) - max(first, start)) / (last - first)


def samples(rows: list[dict], failed: int, cpu, window: tuple[float, float],
            own: dict[str, tuple] | None = None) -> dict:
    """The requests that started and ended within `window`, their timings, and the client's CPU:
    all of it (start-up and report included) over all its finished requests, and the CPU spent
    within the window over the requests of the window (what the streams cost while they ran).

    `in_window` counts the requests within the window with the ones its edges cut by their share
    inside: users in a closed loop finish their requests in step, so a count of whole requests
    jumps by one request a user (10% at 10 a user) when a window's end falls just before or just
    after a round's last tokens, whatever each client's pace.

    With `own` (llmserve's own TTFT and TPOT by completion id) TTFT and TPOT are each request's
    client value minus the server's (`own_tpot`: the server's TPOT of the same requests)."""
    start, end = window
    inside = [r for r in rows if r["start"] >= start and r["start"] + r["e2e"] <= end]
    out = {"count": len(inside), "in_window": sum(share_in(r, start, end) for r in rows),
           "cpu_s": cpu.total_s, "cpu_requests": len(rows),
           "load_cpu_s": cpu.between(start, end), "load_requests": len(inside),
           "ttft": [r["ttft"] for r in inside], "itl": [g for r in inside for g in r["itl"]],
           "tpot": [r["tpot"] for r in inside if r["tpot"] is not None], "own_tpot": [], "unmatched": 0,
           "failed": failed}
    if own is not None:
        matched = [(r, own[r["id"]]) for r in inside if r.get("id") in own]
        out["unmatched"] = len(inside) - len(matched)
        out["ttft"] = [r["ttft"] - ttft for r, (ttft, _) in matched if ttft is not None]
        out["tpot"] = [r["tpot"] - tpot for r, (_, tpot) in matched if r["tpot"] is not None and tpot is not None]
        out["own_tpot"] = [tpot for _, (_, tpot) in matched if tpot is not None]
    return out


def pool(parts: list[dict]) -> dict:
    """Several alternating runs of one client pooled into one sample."""
    out = {"count": 0, "in_window": 0.0, "cpu_s": 0.0, "cpu_requests": 0, "load_cpu_s": 0.0, "load_requests": 0,
           "ttft": [], "itl": [], "tpot": [], "own_tpot": [], "unmatched": 0, "failed": 0, "starts_s": []}
    for part in parts:
        for key, value in part.items():
            out[key] += value
    return out


def pct_ms(values: list[float], p: float) -> float | None:
    return float(np.percentile(values, p)) * 1000 if values else None


def per_request_ms(cpu_s: float, requests: int) -> float | None:
    return 1000 * cpu_s / requests if requests else None


def floors_of(scheduled: bool) -> dict[str, dict[int, float]]:
    """Per metric and percentile what loadgen cannot read sooner than (ms): the schedule; against
    llmserve, whose TTFT and TPOT are judged as client minus the server's own, 0 for those, and 0
    for ITL too: its log has no time per token, and its own TPOT (a mean gap per request) is no
    floor for the gaps' percentiles (a few long steps put the mean above the median)."""
    if scheduled:
        return {"ttft": {50: TTFT_MS, 99: TTFT_MS}, "itl": {50: ITL_MS, 99: ITL_MS}, "tpot": {50: ITL_MS, 99: ITL_MS}}
    return {metric: {50: 0.0, 99: 0.0} for metric in ("ttft", "itl", "tpot")}


def compare(lg: dict, ref: dict, scheduled: bool) -> dict:
    """Per metric and percentile loadgen minus what the server did (the schedule, or llmserve's own
    numbers) and minus the reference, and the verdicts.

    `meets_targets`: counts (requests within the window, `in_window`) within TARGET_COUNT of each
    other, no failure, and per value loadgen no more than the limit (2 ms at p50, 20 ms at p99)
    above the reference; below it, loadgen must still be no more than the limit below what the
    server did (a client cannot read a token before it is sent: a value under it would be loadgen's
    error, one between it and a slower reference is the reference's lateness, not loadgen's).
    Against a schedule server that is the schedule; against llmserve TTFT and TPOT are each
    request's client value minus llmserve's own (so 0), and ITL has no floor but 0.
    `meets_symmetric_targets`: within the limit of the reference either way, for every server."""
    row = {"loadgen_requests": lg["count"], "reference_requests": ref["count"], "loadgen_failed": lg["failed"],
           "loadgen_requests_in_window": lg["in_window"], "reference_requests_in_window": ref["in_window"],
           "count_ratio": lg["in_window"] / ref["in_window"] if ref["in_window"] else None,
           "loadgen_unmatched": lg["unmatched"], "reference_unmatched": ref["unmatched"],
           "judged_against": "schedule" if scheduled else "llmserve's own TTFT and TPOT per request (its log)",
           "loadgen_cpu_ms_per_request": per_request_ms(lg["cpu_s"], lg["cpu_requests"]),
           "reference_cpu_ms_per_request": per_request_ms(ref["cpu_s"], ref["cpu_requests"]),
           "loadgen_load_cpu_ms_per_request": per_request_ms(lg["load_cpu_s"], lg["load_requests"]),
           "reference_load_cpu_ms_per_request": per_request_ms(ref["load_cpu_s"], ref["load_requests"])}
    floors = floors_of(scheduled)
    counts_ok = row["count_ratio"] is not None and abs(row["count_ratio"] - 1) <= TARGET_COUNT and not lg["failed"]
    ok = symmetric = counts_ok
    for metric in ("ttft", "itl", "tpot"):
        for p in (50, 99):
            mine, theirs = pct_ms(lg[metric], p), pct_ms(ref[metric], p)
            floor = floors[metric][p]
            row[f"{metric}_p{p}_ms"] = mine
            row[f"{metric}_p{p}_minus_schedule_ms"] = mine - floor if mine is not None else None
            diff = mine - theirs if mine is not None and theirs is not None else None
            row[f"{metric}_p{p}_minus_reference_ms"] = diff
            limit = TARGET_P50_MS if p == 50 else TARGET_P99_MS
            symmetric = symmetric and diff is not None and abs(diff) <= limit
            if diff is None:
                ok = False
            else:
                ok = ok and diff <= limit and mine >= floor - limit
    row["meets_targets"] = ok
    row["meets_symmetric_targets"] = symmetric
    return row


def fmt(value: float | None) -> str:
    return "     -" if value is None else f"{value:+6.1f}"


def parse_rows(text: str) -> list[tuple[int, int]]:
    """`1,20,100,100x2`: users, and with `xN` Locust processes (both clients alike)."""
    rows = []
    for item in text.split(","):
        users, _, procs = item.strip().partition("x")
        try:
            rows.append((int(users), int(procs or 1)))
        except ValueError:
            raise SystemExit(f"loadgen_fidelity: error: --users: {item!r} is not USERS or USERSxPROCESSES") from None
        if rows[-1][0] < 1 or rows[-1][1] < 1:
            raise SystemExit(f"loadgen_fidelity: error: --users: {item!r}: users and processes must be at least 1")
    return rows


def row_run_time(run_time_s: float, users: int, min_requests: int) -> float:
    """Long enough for `min_requests` finished requests a client at this many users (a request of
    the schedule lasts TTFT + 31 ITL, 0.77 s): one user needs about 31 s for 40."""
    per_request_s = (TTFT_MS + (NUM_TOKENS - 1) * ITL_MS) / 1000
    return max(run_time_s, float(math.ceil(min_requests / users * per_request_s)) + 1)


def run_client(client: str, url: str, users: int, seconds: float, work: Path, tokens: int, dataset: Path,
               extra: list[str]) -> tuple[list[dict], int, object]:
    """One run of one client: its finished requests (one form for both), failures and CPU."""
    if client == "reference":
        results, cpu = run_reference(url, users, seconds, work, extra)
        return reference_rows(results), 0, cpu
    # the reference's very prompt (llmserve's prefix cache then serves both alike)
    report, cpu = run_loadgen(url, users, seconds, work, tokens, ["--dataset", str(dataset), *extra])
    rows, failed = loadgen_rows(report)
    return rows, failed, cpu


def run_together(url: str, users: int, seconds: float, work: Path, tokens: int, dataset: Path,
                 extra: list[str], log: Path) -> dict[str, dict]:
    """Both clients at once against llmserve, each judged on the requests that started and ended
    within the same `seconds` while both ran: from TOGETHER_SETTLE_S after the later of the two
    first requests on (the earlier client's start-up burst, all its users sending at once, would
    otherwise be left out and the later one's judged). Each runs TOGETHER_MARGIN_S longer than the
    window, so the other's slower start-up still leaves a full window.
    TTFT and TPOT per request minus llmserve's own (its log `log`): what the client added."""
    length = seconds + TOGETHER_MARGIN_S
    with ThreadPoolExecutor(2) as pool_:
        futures = {}
        for client in ("reference", "loadgen"):
            # two runs with --processes at once: each master on a port of its own (Locust's default
            # 5557 would be taken by the first), its workers told the same port
            ports = []
            if "--processes" in extra:
                port = str(free_port())
                ports = ["--master-bind-port", port, "--master-port", port]
            futures[client] = pool_.submit(run_client, client, url, users, length, work, tokens, dataset,
                                           [*extra, *ports])
        runs = {client: future.result() for client, future in futures.items()}
    start = max(window_of(rows, seconds)[0] for rows, _, _ in runs.values()) + TOGETHER_SETTLE_S
    own = llmserve_own(log)
    out = {}
    for client, (rows, failed, cpu) in runs.items():
        out[client] = samples(rows, failed, cpu, (start, start + seconds), own)
        # when the client's first and last requests started, seconds from the window's start
        out[client]["starts_s"] = [[round(min(r["start"] for r in rows) - start, 3),
                                    round(max(r["start"] for r in rows) - start, 3)] if rows else []]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="stdlib and nginx at 1 and 20 users, 4 s runs")
    parser.add_argument("--run-time-s", type=float, default=8.0)
    parser.add_argument("--min-requests", type=int, default=40,
                        help="lengthen a row's runs until each client finishes about this many requests")
    parser.add_argument("--rounds", type=int, default=1, help="alternating runs of each client per row, pooled")
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--users", default="1,20,100,100x2",
                        help="rows: users, or USERSxPROCESSES for Locust's --processes (both clients)")
    args = parser.parse_args()
    servers = ["stdlib", "nginx"] if args.quick else args.servers.split(",")
    unknown = sorted(set(servers) - set(SERVERS))
    if unknown:
        raise SystemExit(f"loadgen_fidelity: error: --servers: unknown {', '.join(unknown)} "
                         f"(choose from {', '.join(SERVERS)})")
    levels = [(1, 1), (20, 1)] if args.quick else parse_rows(args.users)
    run_time_s = 4.0 if args.quick else args.run_time_s
    min_requests = 10 if args.quick else args.min_requests
    rows, load_before = [], os.getloadavg()
    print("server       users  lg/ref n in window  TTFT p50 -sched -ref  p99 -ref | ITL p50 -sched -ref  p99 -ref | "
          "TPOT p50 -ref  p99 -ref | CPU ms/req lg ref | in load lg ref | drift lg ref", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "reference-prompt.json"
        dataset.write_text(json.dumps([{"conversations": [{"from": "human", "value": REFERENCE_PROMPT},
                                                          {"from": "gpt", "value": "a story"}]}]))
        for kind in servers:
            server = start(kind, Path(tmp) / kind)
            try:
                for i, (users, procs) in enumerate(levels):
                    work = Path(tmp) / f"{kind}-{users}x{procs}"
                    work.mkdir(parents=True, exist_ok=True)
                    extra = ["--processes", str(procs)] if procs > 1 else []
                    seconds = row_run_time(run_time_s, users, min_requests)
                    parts: dict[str, list] = {"reference": [], "loadgen": []}
                    tokens = LLMSERVE_TOKENS if kind == "llmserve" else NUM_TOKENS
                    os.environ["LOADGEN_REFERENCE_TOKENS"] = str(tokens)
                    server_ttft: dict[str, list] = {"reference": [], "loadgen": []}
                    rounds = max(args.rounds, LLMSERVE_ROUNDS) if kind == "llmserve" else args.rounds
                    for n in range(rounds):
                        if kind == "llmserve":  # no schedule: both at once, on the same server, half the users each
                            parts_now = run_together(server.url, max(1, users // 2), seconds, work, tokens, dataset,
                                                     extra, Path(tmp) / kind / "llmserve.log")
                            for client in parts:
                                parts[client].append(parts_now[client])
                            time.sleep(1.0)
                            continue
                        order = ("reference", "loadgen") if (i + n) % 2 == 0 else ("loadgen", "reference")
                        for client in order:
                            seen = len(server.stats()["server_ttft_s"])
                            rows_, failed, cpu = run_client(client, server.url, users, seconds + RUN_MARGIN_S,
                                                            work, tokens, dataset, extra)
                            parts[client].append(samples(rows_, failed, cpu, window_of(rows_, seconds)))
                            time.sleep(1.0)  # the server's last streams end before the next run starts
                            server_ttft[client] += server.stats()["server_ttft_s"][seen:]  # its own TTFT
                    pooled = {client: pool(p) for client, p in parts.items()}
                    row = {"server": server.kind, "users": users, "processes": procs, "run_time_s": seconds,
                           "rounds": rounds, "together": kind == "llmserve",
                           "users_per_client": max(1, users // 2) if kind == "llmserve" else users,
                           **compare(pooled["loadgen"], pooled["reference"], kind != "llmserve")}
                    if kind == "llmserve":  # client drift: per request, client TTFT minus llmserve's own
                        row["starts_s"] = {client: pooled[client]["starts_s"] for client in pooled}
                        for client in ("loadgen", "reference"):
                            row[f"{client}_drift_p50_ms"] = pct_ms(pooled[client]["ttft"], 50)
                    for client, values in server_ttft.items():  # client drift: client TTFT minus the server's
                        if not values:
                            continue
                        mine = pct_ms(pooled[client]["ttft"], 50)
                        own = pct_ms(values, 50)
                        row[f"server_ttft_p50_ms_{client}"] = own
                        row[f"{client}_drift_p50_ms"] = mine - own if mine is not None and own is not None else None
                    rows.append(row)
                    label = f"{users}" if procs == 1 else f"{users}x{procs}"
                    counts = f"{row['loadgen_requests_in_window']:.1f}/{row['reference_requests_in_window']:.1f}"
                    print(f"{server.kind:12s} {label:>5s} {counts:<19s} "
                          f"{fmt(row['ttft_p50_minus_schedule_ms'])} {fmt(row['ttft_p50_minus_reference_ms'])} "
                          f"{fmt(row['ttft_p99_minus_reference_ms'])} | {fmt(row['itl_p50_minus_schedule_ms'])} "
                          f"{fmt(row['itl_p50_minus_reference_ms'])} {fmt(row['itl_p99_minus_reference_ms'])} | "
                          f"{fmt(row['tpot_p50_minus_reference_ms'])} {fmt(row['tpot_p99_minus_reference_ms'])} | "
                          f"{fmt(row['loadgen_cpu_ms_per_request'])} {fmt(row['reference_cpu_ms_per_request'])} | "
                          f"{fmt(row['loadgen_load_cpu_ms_per_request'])} {fmt(row['reference_load_cpu_ms_per_request'])} | "
                          f"{fmt(row.get('loadgen_drift_p50_ms'))} {fmt(row.get('reference_drift_p50_ms'))}"
                          f"  {'ok' if row['meets_targets'] else 'MISSES'}"
                          f" (symmetric {'ok' if row['meets_symmetric_targets'] else 'misses'})", flush=True)
            finally:
                server.stop()
    print(json.dumps({"all_meet_targets": all(r["meets_targets"] for r in rows),
                      "num_rows_meeting_targets": sum(r["meets_targets"] for r in rows), "num_rows": len(rows),
                      "num_rows_meeting_symmetric_targets": sum(r["meets_symmetric_targets"] for r in rows),
                      "targets": {"p50_ms": TARGET_P50_MS, "p99_ms": TARGET_P99_MS, "count_ratio": TARGET_COUNT},
                      "schedule": {"ttft_ms": TTFT_MS, "itl_ms": ITL_MS, "tokens": NUM_TOKENS},
                      "run_time_s": run_time_s, "min_requests": min_requests, "rounds": args.rounds,
                      "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                      "cpu_count": os.cpu_count(), "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
