"""PNG plots of a run over time: latency percentiles, throughput, and requests in flight."""

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from loadgen.records import Outcome, RequestRecord  # noqa: E402

LATENCY_PNG = "loadgen_latency.png"
THROUGHPUT_PNG = "loadgen_throughput.png"
CONCURRENCY_PNG = "loadgen_concurrency.png"


@dataclass(slots=True)
class TimeSeries:
    seconds: list[float]  # bucket starts, seconds since the run began
    ttft_p50_ms: list[float | None]
    ttft_p99_ms: list[float | None]
    e2e_p50_ms: list[float | None]
    e2e_p99_ms: list[float | None]
    requests_per_s: list[float]
    tokens_per_s: list[float]
    in_flight: list[int]  # requests in flight at each bucket start


def _pct(values: list[float], p: float) -> float | None:
    return float(np.percentile(values, p)) * 1000 if values else None


def time_series(records: list[RequestRecord], bucket_s: float = 1.0) -> TimeSeries:
    t0 = min(r.scheduled_unix for r in records)
    spans = [(r.scheduled_unix - t0, r.scheduled_unix - t0 + (r.end_s or r.e2e_s or 0.0)) for r in records]
    num_buckets = max(1, int(np.ceil(max(end for _, end in spans) / bucket_s)))
    ttfts: list[list[float]] = [[] for _ in range(num_buckets)]
    e2es: list[list[float]] = [[] for _ in range(num_buckets)]
    completed = [0.0] * num_buckets
    tokens = [0.0] * num_buckets
    for r, (start, end) in zip(records, spans, strict=True):
        if r.outcome is Outcome.OK:
            b = min(num_buckets - 1, int(end / bucket_s))
            completed[b] += 1
            if r.ttft_s is not None:
                ttfts[b].append(r.ttft_s)
            if r.e2e_s is not None:
                e2es[b].append(r.e2e_s)
        if r.num_chunks:  # spread the request's tokens over its chunks' arrival times
            per_chunk = (r.output_tokens or r.num_chunks) / r.num_chunks
            for offset in r.chunk_offsets_s:
                tokens[min(num_buckets - 1, int((start + offset) / bucket_s))] += per_chunk
    seconds = [i * bucket_s for i in range(num_buckets)]
    in_flight = [sum(1 for start, end in spans if start <= t < end) for t in seconds]
    # The last bucket ends with the last request, not a whole bucket later: rates over the time it covers.
    run_end = max(end for _, end in spans)
    widths = [max(1e-9, min(bucket_s, run_end - t)) for t in seconds]
    return TimeSeries(
        seconds=seconds,
        ttft_p50_ms=[_pct(v, 50) for v in ttfts], ttft_p99_ms=[_pct(v, 99) for v in ttfts],
        e2e_p50_ms=[_pct(v, 50) for v in e2es], e2e_p99_ms=[_pct(v, 99) for v in e2es],
        requests_per_s=[c / w for c, w in zip(completed, widths, strict=True)],
        tokens_per_s=[t / w for t, w in zip(tokens, widths, strict=True)],
        in_flight=in_flight,
    )


def _plot(path: Path, title: str, ylabel: str, x: list[float], lines: dict[str, list]) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    for label, ys in lines.items():
        ax.plot(x, [np.nan if y is None else y for y in ys], label=label, marker=".")
    ax.set_title(title)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _plot_two_axes(path: Path, title: str, x: list[float], left: tuple[str, list], right: tuple[str, list]) -> None:
    """Two rates of different scale (tokens/s is hundreds of times requests/s), each on its own axis."""
    fig, ax = plt.subplots(figsize=(8, 4))
    twin = ax.twinx()
    ax.plot(x, left[1], label=left[0], marker=".", color="tab:blue")
    twin.plot(x, right[1], label=right[0], marker=".", color="tab:orange")
    ax.set_ylabel(left[0], color="tab:blue")
    twin.set_ylabel(right[0], color="tab:orange")
    ax.set_title(title)
    ax.set_xlabel("seconds since start")
    ax.grid(True, alpha=0.3)
    fig.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_plots(records: list[RequestRecord], report_dir: Path) -> list[Path]:
    ts = time_series(records)
    paths = [report_dir / LATENCY_PNG, report_dir / THROUGHPUT_PNG, report_dir / CONCURRENCY_PNG]
    _plot(paths[0], "Latency percentiles (requests finishing each second)", "ms", ts.seconds,
          {"TTFT p50": ts.ttft_p50_ms, "TTFT p99": ts.ttft_p99_ms,
           "E2E p50": ts.e2e_p50_ms, "E2E p99": ts.e2e_p99_ms})
    _plot_two_axes(paths[1], "Throughput", ts.seconds, ("output tokens/s", ts.tokens_per_s),
                   ("requests/s (completed)", ts.requests_per_s))
    _plot(paths[2], "Requests in flight", "requests", ts.seconds, {"in flight": ts.in_flight})
    return paths
