"""The end-of-run report: summary JSON and markdown, per-request CSV, and the plots.

Percentiles are numpy's linear ones over the raw per-request values (Locust rounds its own), in
seconds at full precision. Only successful requests enter latency statistics and throughput,
as in vLLM's `bench serve`, except that TTFT and ITL also count the streams the abort profile
cancelled (what they saw before cancelling is real); goodput counts requests meeting every SLO
given (DistServe's definition).
"""

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loadgen.looplag import OVERLOADED_P99_S
from loadgen.records import FailureKind, Outcome, RequestRecord, TokenSource

SUMMARY_JSON = "loadgen_summary.json"
SUMMARY_MD = "loadgen_summary.md"
REQUESTS_CSV = "loadgen_requests.csv"
PERCENTILES = (50, 90, 95, 99)
CSV_FIELDS = ("request_id", "worker", "profile", "scheduled_unix", "client_queue_s", "outcome", "failure_kind",
              "http_status", "ttft_s", "tpot_s", "e2e_s", "end_s", "num_chunks", "prompt_tokens", "output_tokens",
              "output_tokens_source", "cached_tokens", "finish_reason", "max_tokens", "response_id", "itl_s",
              "error")


class ReportError(Exception):
    """The report directory cannot be written."""


@dataclass(slots=True)
class RunInfo:
    profile: str
    endpoint: str
    host: str
    model: str | None
    slo: dict  # ttft_ms, tpot_ms, e2e_ms (None: not set)
    block_size: int
    shared_prefix_tokens: float | None = None  # estimate, shared-prefix profile only
    stream: bool = True  # False under --no-stream: no TTFT, ITL or TPOT can be measured
    client_cpu_warning: bool = False  # Locust warned that a client process ran above 90% CPU
    max_client_cpu_percent: float | None = None  # the highest CPU share Locust measured in a client process
    client_loop_lag_p99_s: float | None = None  # how late the client's loop ran a timer, p99 (worst process)


def distribution(values: list[float]) -> dict:
    if not values:
        return {"count": 0, "mean": None, "min": None, "max": None, **{f"p{p}": None for p in PERCENTILES}}
    arr = np.asarray(values, dtype=float)
    stats = {"count": len(values), "mean": float(arr.mean()), "min": float(arr.min()), "max": float(arr.max())}
    for p, value in zip(PERCENTILES, np.percentile(arr, PERCENTILES), strict=True):
        stats[f"p{p}"] = float(value)
    return stats


def meets_slo(record: RequestRecord, slo: dict) -> bool:
    """vLLM goodput: every SLO given holds; TPOT counts as 0 for single-token answers."""
    if slo.get("ttft_ms") is not None and (record.ttft_s is None or record.ttft_s * 1000 > slo["ttft_ms"]):
        return False
    if slo.get("tpot_ms") is not None and (record.tpot_s or 0.0) * 1000 > slo["tpot_ms"]:
        return False
    if slo.get("e2e_ms") is not None and (record.e2e_s is None or record.e2e_s * 1000 > slo["e2e_ms"]):
        return False
    return True


def run_window(records: list[RequestRecord]) -> tuple[float, float]:
    """Wall-clock span from the first scheduled send to the last request's end."""
    starts = [r.scheduled_unix for r in records]
    ends = [r.scheduled_unix + (r.end_s or r.e2e_s or 0.0) for r in records]
    return min(starts), max(ends)


def prefix_cache_section(ok: list[RequestRecord], info: RunInfo) -> dict:
    prompt_total = sum(r.prompt_tokens or 0 for r in ok)
    reported = [r for r in ok if r.cached_tokens is not None]
    measured = (sum(r.cached_tokens for r in reported) / prompt_total) if reported and prompt_total else None
    best = None
    if info.profile == "dynamic-prefix":
        best = 0.0  # the unique stamp sits in the first block: no block can ever match
    elif info.profile == "shared-prefix" and info.shared_prefix_tokens is not None and prompt_total:
        block = info.block_size
        shared_blocks = math.floor(info.shared_prefix_tokens / block) * block
        # The first request fills the cache; the last prompt token is always recomputed.
        in_order = sorted(ok, key=lambda r: r.scheduled_unix)
        cacheable = [min(shared_blocks, math.floor(((r.prompt_tokens or 1) - 1) / block) * block) for r in in_order]
        best = sum(cacheable[1:]) / prompt_total
    return {"block_size": info.block_size, "measured_hit_rate": measured, "best_possible_hit_rate": best,
            "shared_prefix_tokens_est": info.shared_prefix_tokens,
            "num_requests_reporting_cached_tokens": len(reported)}


def summarize(records: list[RequestRecord], info: RunInfo) -> dict:
    ok = [r for r in records if r.outcome is Outcome.OK]
    failed = [r for r in records if r.outcome is Outcome.FAILED]
    # A cancelled stream's TTFT and ITL are real. A stream the end of the test cut keeps what it received
    # in the CSV and the plots, but not here: its last reads raced Locust stopping every user at once.
    timed = ok + [r for r in records if r.outcome is Outcome.ABORTED]
    start, end = run_window(records) if records else (0.0, 0.0)
    duration_s = end - start
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: None)
    output_tokens = sum(r.output_tokens or 0 for r in ok)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    slo_set = any(v is not None for v in info.slo.values())
    num_good = sum(1 for r in ok if meets_slo(r, info.slo)) if slo_set else None
    by_source = {s.value: sum(1 for r in ok if r.output_tokens_source is s) for s in TokenSource}
    return {
        "profile": info.profile, "endpoint": info.endpoint, "stream": info.stream, "host": info.host,
        "model": info.model, "start_unix": start, "duration_s": duration_s,
        "num_requests": len(records), "num_succeeded": len(ok), "num_failed": len(failed),
        "num_aborted": sum(1 for r in records if r.outcome is Outcome.ABORTED),
        "num_incomplete": sum(1 for r in records if r.outcome is Outcome.INCOMPLETE),
        "failures": {k.value: sum(1 for r in failed if r.failure_kind is k) for k in FailureKind},
        "ttft_s": distribution([r.ttft_s for r in timed if r.ttft_s is not None]),
        "tpot_s": distribution([r.tpot_s for r in ok if r.tpot_s is not None]),
        "itl_s": distribution([gap for r in timed for gap in r.itl_s]),
        "e2e_s": distribution([r.e2e_s for r in ok if r.e2e_s is not None]),
        "client_queue_s": distribution([r.client_queue_s for r in ok]),
        "request_throughput_rps": per_s(len(ok)),
        "output_token_throughput_tps": per_s(output_tokens),
        "total_token_throughput_tps": per_s(output_tokens + prompt_tokens),
        "total_prompt_tokens": prompt_tokens, "total_output_tokens": output_tokens,
        "slo": info.slo, "num_good": num_good,
        "goodput_rps": per_s(num_good) if num_good is not None else None,
        "output_tokens_source": by_source,
        "output_tokens_estimated": by_source[TokenSource.CHUNKS.value] > 0,
        "prefix_cache": prefix_cache_section(ok, info),
        "client_cpu_warning": info.client_cpu_warning,
        "max_client_cpu_percent": info.max_client_cpu_percent,
        "client_loop_lag_p99_s": info.client_loop_lag_p99_s,
        "client_overloaded": info.client_cpu_warning or (info.client_loop_lag_p99_s or 0.0) > OVERLOADED_P99_S,
    }


def write_report(records: list[RequestRecord], info: RunInfo, report_dir: Path, plots: bool = True) -> dict:
    """Write every report file; returns the summary."""
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
        summary = summarize(records, info)
        (report_dir / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n")
        (report_dir / SUMMARY_MD).write_text(markdown(summary))
        write_csv(records, report_dir / REQUESTS_CSV)
    except OSError as exc:
        raise ReportError(f"cannot write the report into {report_dir}: {exc.strerror}") from exc
    if plots and records:
        from loadgen.plots import write_plots  # matplotlib is slow to import; only when needed

        write_plots(records, report_dir)
    return summary


def write_csv(records: list[RequestRecord], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in sorted(records, key=lambda r: r.scheduled_unix):
            row = r.to_dict()
            row["tpot_s"] = r.tpot_s
            row["itl_s"] = " ".join(repr(gap) for gap in r.itl_s)
            writer.writerow({k: row.get(k) for k in CSV_FIELDS})


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.3f}"


def _rate(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.3f} {unit}"


def _share(value: float | None, missing: str) -> str:
    return missing if value is None else f"{value:.1%}"


def _slo_text(slo: dict) -> str:
    names = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "E2E"}
    return ", ".join(f"{names[k]} <= {v:g} ms" for k, v in slo.items() if v is not None)


def markdown(s: dict) -> str:
    lines = [f"# Load test summary: profile `{s['profile']}`", "",
             f"Host {s['host']}, endpoint {s['endpoint']}, model {s['model'] or 'not known'}, "
             f"duration {s['duration_s']:.3f} s."
             + ("" if s.get("stream", True) else " Not streamed (--no-stream): E2E only, no TTFT, ITL or TPOT."), "",
             f"Requests: {s['num_requests']} sent, {s['num_succeeded']} succeeded, {s['num_failed']} failed, "
             f"{s['num_aborted']} aborted on purpose, {s['num_incomplete']} cut by the end of the test"
             + (" (still streaming when it stopped: what they received is in the CSV, not in the latencies)."
                if s["num_incomplete"] else "."), ""]
    lines += _warnings(s)
    lines += ["| metric (ms) | count | mean | p50 | p90 | p95 | p99 | max |", "|---|---|---|---|---|---|---|---|"]
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "client_queue_s"):
        d = s[key]
        lines.append(f"| {key[:-2].upper()} | {d['count']} | {_ms(d['mean'])} | {_ms(d['p50'])} | {_ms(d['p90'])} | "
                     f"{_ms(d['p95'])} | {_ms(d['p99'])} | {_ms(d['max'])} |")
    lines += ["", f"- Request throughput: {_rate(s['request_throughput_rps'], 'req/s')}",
              f"- Output token throughput: {_rate(s['output_token_throughput_tps'], 'tok/s')}",
              f"- Total token throughput: {_rate(s['total_token_throughput_tps'], 'tok/s')}"]
    if s["num_good"] is None:
        lines.append("- Goodput: no SLO given (--slo-ttft-ms, --slo-tpot-ms, --slo-e2e-ms)")
    else:
        lines.append(f"- Goodput: {_rate(s['goodput_rps'], 'req/s')} ({s['num_good']} of {s['num_succeeded']} "
                     f"requests meeting {_slo_text(s['slo'])})")
    pc = s["prefix_cache"]
    measured = _share(pc["measured_hit_rate"], "not reported by the server")
    best = _share(pc["best_possible_hit_rate"], "not estimated for this profile")
    lines.append(f"- Prefix cache hit rate: measured {measured}, best possible {best} (block size {pc['block_size']})")
    lines += ["", "| failure kind | count |", "|---|---|"]
    lines += [f"| {kind} | {count} |" for kind, count in s["failures"].items()]
    return "\n".join(lines) + "\n"


def _warnings(s: dict) -> list[str]:
    """What limits the numbers above, said before them."""
    notes = []
    if s.get("client_cpu_warning"):
        peak = s.get("max_client_cpu_percent")
        notes.append("- **The client was CPU-bound**: Locust measured a client process above 90% CPU"
                     + (f" (peak {peak:.0f}%)" if peak is not None else "")
                     + ". Latencies include time streams waited for the client: run more processes "
                     "(--processes N) before reading them as the server's.")
    lag = s.get("client_loop_lag_p99_s")
    if lag is not None and lag > OVERLOADED_P99_S:
        notes.append(f"- **The client fell behind**: its event loop ran timers {lag * 1000:.1f} ms late at p99 "
                     f"(over {OVERLOADED_P99_S * 1000:.0f} ms), so reads of every stream waited as long; TTFT and "
                     "ITL include that wait. Run more processes (--processes N) or give the client its own CPUs.")
    if s["output_tokens_estimated"]:
        notes.append(f"- **Output tokens estimated** for {s['output_tokens_source']['chunks']} requests: the server "
                     "sent no usage, so tokens were counted as content chunks; TPOT and token throughput are "
                     "estimates.")
    if s["num_incomplete"]:
        notes.append(f"- {s['num_incomplete']} requests were cut by the end of the test.")
    return notes + [""] if notes else []
