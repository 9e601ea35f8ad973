"""Does the load generator measure what the engine measures? loadgen's p50 against the bucket of the
engine's own histogram that holds the median of the same requests, and loadgen's output tokens
(from the stream's `usage`) against the engine's generation-token counter.

The engine's /metrics is read just before Locust starts and just after it exits; nothing else sends
generation requests in between, so the counters' and histograms' deltas cover exactly the requests
loadgen made (loadgen sends no calibration probe with --dataset, and --stop-timeout lets every
started request finish).

The bucket holding a median. A Prometheus bucket `le=x` counts samples <= x, so bucket i holds the
samples in (le[i-1], le[i]] (the first bucket from 0: latencies are not negative). loadgen's p50 is
numpy's linear one: the mean of the order statistics at 0-based ranks floor((n-1)/2) and
ceil((n-1)/2). The rank-r sample lies in the first bucket whose cumulative count exceeds r; when the
two ranks fall in different buckets the median lies anywhere from the lower one's lower edge to the
upper one's upper edge, and that span is the bucket (edges included as Prometheus counts them:
lower edge excluded, upper edge included). loadgen's p50 agrees when lo < p50 <= hi.

What the client times outside vLLM's timers. vLLM's TTFT and E2E both start at the request's
`arrival_time` (set when its API server starts rendering the prompt) and end when its API server's
output handler receives the step's outputs: the HTTP request and its parsing before, the SSE
events, their write and the client's read after, are loadgen's alone, once per request at each end.
The E2E row measures that time on the same requests: loadgen's E2E mean less vLLM's. The TTFT row
allows it on top of the bucket's upper edge (lo < p50 <= hi + that, when positive): measured with a
plain client one request at a time, loadgen's TTFT less vLLM's and loadgen's E2E less vLLM's were
4.1 and 4.6 ms at the median (docs/loadgen.md). ITL and TPOT are differences of two times on one
side each: nothing to allow.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

# loadgen's summary key -> the engine histogram of the same quantity, newest name first (vLLM
# renamed its per-token histogram; TPOT per request exists since 0.11).
VLLM_HISTOGRAMS = {
    "ttft_s": ("TTFT", ("vllm:time_to_first_token_seconds",)),
    "itl_s": ("ITL", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")),
    "tpot_s": ("TPOT", ("vllm:request_time_per_output_token_seconds",)),
    "e2e_s": ("E2E", ("vllm:e2e_request_latency_seconds",)),
}
VLLM_GENERATION_TOKENS = "vllm:generation_tokens"  # a counter family: its sample is ..._total
VLLM_REQUEST_SUCCESS = "vllm:request_success"


class ExpositionError(ValueError):
    """A /metrics text that cannot be read; the message says what is wrong."""


@dataclass(slots=True)
class Histogram:
    """One histogram family summed over its label sets: cumulative counts by upper edge."""

    edges: list[float]  # the le values, ascending, +Inf last
    cumulative: list[float]
    sum: float
    count: float


def parse_exposition(text: str) -> dict[str, list]:
    """Family name -> its samples (prometheus_client's parser; counters lose `_total` in the name)."""
    try:
        return {family.name: family.samples for family in text_string_to_metric_families(text)}
    except ValueError as exc:
        raise ExpositionError(f"cannot parse the /metrics text: {exc}") from exc


def histogram(families: dict[str, list], name: str) -> Histogram | None:
    samples = families.get(name)
    if samples is None:
        return None
    by_edge: dict[float, float] = {}
    total_sum = total_count = 0.0
    for sample in samples:
        if sample.name == f"{name}_bucket":
            edge = float(sample.labels["le"])
            by_edge[edge] = by_edge.get(edge, 0.0) + sample.value
        elif sample.name == f"{name}_sum":
            total_sum += sample.value
        elif sample.name == f"{name}_count":
            total_count += sample.value
    edges = sorted(by_edge)
    if not edges or not math.isinf(edges[-1]):
        raise ExpositionError(f"histogram {name} has no +Inf bucket")
    return Histogram(edges=edges, cumulative=[by_edge[e] for e in edges], sum=total_sum, count=total_count)


def counter(families: dict[str, list], name: str) -> float | None:
    """A counter family summed over its label sets (its `_total` samples), None if absent."""
    samples = families.get(name)
    if samples is None:
        return None
    return sum(s.value for s in samples if s.name == f"{name}_total")


def delta(before: Histogram, after: Histogram) -> Histogram:
    """What was observed between two reads of the same histogram."""
    if before.edges != after.edges:
        raise ExpositionError(f"bucket edges changed between the reads: {before.edges} vs {after.edges}")
    return Histogram(edges=list(after.edges), cumulative=[a - b for a, b in zip(after.cumulative, before.cumulative,
                                                                                   strict=True)],
                     sum=after.sum - before.sum, count=after.count - before.count)


def _bucket_of_rank(hist: Histogram, rank: int) -> int:
    for index, cumulative in enumerate(hist.cumulative):
        if cumulative > rank:
            return index
    raise ExpositionError(f"rank {rank} beyond the histogram's {hist.cumulative[-1]:g} samples")


def median_bucket(hist: Histogram) -> tuple[float, float] | None:
    """(lo, hi]: where the median of the histogram's samples lies (module docstring); None if empty."""
    num = round(hist.cumulative[-1])
    if num <= 0:
        return None
    low_index = _bucket_of_rank(hist, (num - 1) // 2)
    high_index = _bucket_of_rank(hist, num // 2)
    lo = hist.edges[low_index - 1] if low_index > 0 else 0.0
    return lo, hist.edges[high_index]


def in_bucket(value: float, bucket: tuple[float, float]) -> bool:
    lo, hi = bucket
    return lo < value <= hi


@dataclass(slots=True)
class Row:
    metric: str  # TTFT, ITL, TPOT, E2E
    histogram: str  # the engine's family name
    engine_count: int
    loadgen_count: int
    bucket: tuple[float, float] | None  # (lo, hi] holding the engine's median
    loadgen_p50_s: float | None
    engine_mean_s: float | None
    loadgen_mean_s: float | None
    agrees: bool
    # TTFT: the time outside vLLM's timers allowed above the bucket's upper edge (the E2E row's mean
    # offset, when positive; module docstring); None for the other rows
    outside_s: float | None = None

    @property
    def mean_offset_s(self) -> float | None:
        """What the client adds on average (loadgen's mean minus the engine's, same requests)."""
        if self.engine_mean_s is None or self.loadgen_mean_s is None:
            return None
        return self.loadgen_mean_s - self.engine_mean_s


def _first_histogram(families: dict[str, list], names: tuple[str, ...]) -> tuple[str, Histogram] | None:
    for name in names:
        hist = histogram(families, name)
        if hist is not None:
            return name, hist
    return None


def compare_latencies(before: dict[str, list], after: dict[str, list], summary: dict) -> list[Row]:
    rows = []
    for key, (metric, names) in VLLM_HISTOGRAMS.items():
        found_before, found_after = _first_histogram(before, names), _first_histogram(after, names)
        if found_before is None or found_after is None or found_before[0] != found_after[0]:
            continue
        hist = delta(found_before[1], found_after[1])
        stats = summary.get(key) or {}
        p50 = stats.get("p50")
        bucket = median_bucket(hist)
        rows.append(Row(metric=metric, histogram=found_after[0], engine_count=round(hist.count),
                        loadgen_count=int(stats.get("count") or 0), bucket=bucket, loadgen_p50_s=p50,
                        engine_mean_s=hist.sum / hist.count if hist.count > 0 else None,
                        loadgen_mean_s=stats.get("mean"),
                        agrees=bucket is not None and p50 is not None and in_bucket(p50, bucket)))
    by_metric = {row.metric: row for row in rows}
    ttft, e2e = by_metric.get("TTFT"), by_metric.get("E2E")
    outside = e2e.mean_offset_s if e2e is not None else None
    if ttft is not None and outside is not None and outside > 0:
        ttft.outside_s = outside
        if ttft.bucket is not None and ttft.loadgen_p50_s is not None:
            lo, hi = ttft.bucket
            ttft.agrees = in_bucket(ttft.loadgen_p50_s, (lo, hi + outside))
    return rows


@dataclass(slots=True)
class Agreement:
    rows: list[Row]
    engine_requests: int | None  # request_success_total's delta, every finished_reason
    engine_output_tokens: int | None  # generation_tokens_total's delta
    loadgen_requests: int
    loadgen_output_tokens: int
    loadgen_tokens_from_usage: int  # requests whose output tokens came from the stream's usage
    failures: list[str]

    def to_json(self) -> dict:
        doc = asdict(self)
        for row, data in zip(self.rows, doc["rows"], strict=True):
            data["mean_offset_s"] = row.mean_offset_s
        return doc


def _counter_delta(before: dict[str, list], after: dict[str, list], name: str) -> int | None:
    start, end = counter(before, name), counter(after, name)
    return None if start is None or end is None else round(end - start)


def _load_failures(summary: dict) -> list[str]:
    """The comparison holds only if both sides saw the same, complete, requests."""
    failures = []
    for key, what in (("num_failed", "failed"), ("num_incomplete", "cut by the end of the test"),
                      ("num_aborted", "cancelled")):
        if summary.get(key):
            failures.append(f"loadgen: {summary[key]} requests {what}: the engine's histograms do not hold them alike")
    return failures


def compare(before_text: str, after_text: str, summary: dict) -> Agreement:
    """The whole check: latency rows, request count, output tokens (usage) against the engine's."""
    before, after = parse_exposition(before_text), parse_exposition(after_text)
    rows = compare_latencies(before, after, summary)
    failures = _load_failures(summary)
    num_ok = int(summary.get("num_succeeded") or 0)
    from_usage = int((summary.get("output_tokens_source") or {}).get("usage") or 0)
    result = Agreement(rows=rows, engine_requests=_counter_delta(before, after, VLLM_REQUEST_SUCCESS),
                       engine_output_tokens=_counter_delta(before, after, VLLM_GENERATION_TOKENS),
                       loadgen_requests=num_ok, loadgen_output_tokens=int(summary.get("total_output_tokens") or 0),
                       loadgen_tokens_from_usage=from_usage, failures=failures)
    if num_ok == 0:
        failures.append("loadgen: no request succeeded")
    if from_usage != num_ok:
        failures.append(f"loadgen: output tokens of {num_ok - from_usage} of {num_ok} requests were counted from "
                        "chunks, not from the stream's usage")
    if result.engine_requests != num_ok:
        failures.append(f"requests: the engine finished {result.engine_requests}, loadgen completed {num_ok}")
    if result.engine_output_tokens != result.loadgen_output_tokens:
        failures.append(f"output tokens: the engine generated {result.engine_output_tokens}, loadgen's usage "
                        f"says {result.loadgen_output_tokens}")
    wanted = {metric for metric, _ in VLLM_HISTOGRAMS.values()}
    missing = wanted - {row.metric for row in rows}
    if missing:
        failures.append(f"the engine's /metrics has no histogram for {', '.join(sorted(missing))}")
    behind = _client_behind(summary)
    for row in rows:
        if not row.agrees:
            failures.append(f"{row.metric}: loadgen p50 {fmt_ms(row.loadgen_p50_s)} is not in the bucket "
                            f"{fmt_bucket(row.bucket)}{fmt_outside(row.outside_s)} holding the median of "
                            f"{row.histogram}{behind}")
    return result


def _client_behind(summary: dict) -> str:
    """What loadgen itself said about its own timing: a starved client measures its own waits too."""
    if not summary.get("client_overloaded"):
        return ""
    lag = summary.get("client_loop_lag_p99_s")
    lag_text = f"ran timers {lag * 1000:.0f} ms late at p99" if lag is not None else "warned of its CPU"
    return f" (loadgen's own loop {lag_text}: the client fell behind)"


def fmt_ms(value: float | None) -> str:
    return "none" if value is None else f"{value * 1000:.2f} ms"


def fmt_bucket(bucket: tuple[float, float] | None) -> str:
    if bucket is None:
        return "(no samples)"
    lo, hi = bucket
    return f"({lo * 1000:g}, {hi * 1000:g}] ms"


def fmt_outside(outside_s: float | None) -> str:
    """The allowance above a bucket's upper edge, as the table and the failures word it."""
    return "" if outside_s is None else f" (+{outside_s * 1000:.2f} ms outside vLLM's timers, from E2E)"


def table(result: Agreement) -> str:
    """The result as a markdown table (docs and the report folder)."""
    lines = ["| metric | vLLM histogram | samples vLLM / loadgen | vLLM p50 bucket | loadgen p50 | agrees? | "
             "mean vLLM / loadgen | loadgen - vLLM (mean) |", "|---|---|---|---|---|---|---|---|"]
    for row in result.rows:
        means = f"{fmt_ms(row.engine_mean_s)} / {fmt_ms(row.loadgen_mean_s)}"
        offset = row.mean_offset_s
        lines.append(f"| {row.metric} | `{row.histogram}` | {row.engine_count} / {row.loadgen_count} | "
                     f"{fmt_bucket(row.bucket)}{fmt_outside(row.outside_s)} | {fmt_ms(row.loadgen_p50_s)} | {'yes' if row.agrees else 'no'} | "
                     f"{means} | {'-' if offset is None else f'{offset * 1000:+.2f} ms'} |")
    lines.append(f"| output tokens | `{VLLM_GENERATION_TOKENS}_total` | {result.engine_requests} / "
                 f"{result.loadgen_requests} requests | {result.engine_output_tokens} | "
                 f"{result.loadgen_output_tokens} (usage in {result.loadgen_tokens_from_usage}) | "
                 f"{'yes' if result.engine_output_tokens == result.loadgen_output_tokens else 'no'} | | |")
    return "\n".join(lines) + "\n"


def write(result: Agreement, report_dir: Path) -> None:
    (report_dir / "agreement.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    (report_dir / "agreement.md").write_text(table(result))
