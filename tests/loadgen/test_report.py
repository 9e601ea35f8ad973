"""Report maths: exact percentiles, throughput, goodput, failure counts, prefix hit rates, and the files."""

import csv
import json

import pytest

from loadgen.plots import time_series
from loadgen.records import FailureKind, Outcome, RequestRecord, TokenSource
from loadgen.report import (
    REQUESTS_CSV,
    SUMMARY_JSON,
    SUMMARY_MD,
    RunInfo,
    distribution,
    markdown,
    summarize,
    write_report,
)


def ok(i: int, ttft: float, itl: list[float], out: int | None = None, prompt: int = 100, cached: int = 0,
       source: TokenSource = TokenSource.USAGE) -> RequestRecord:
    e2e = ttft + sum(itl)
    return RequestRecord(request_id=f"r{i}", worker="local", profile="steady", scheduled_unix=1000.0 + i,
                         ttft_s=ttft, e2e_s=e2e, end_s=e2e, itl_s=itl, num_chunks=len(itl) + 1,
                         prompt_tokens=prompt, output_tokens=out or len(itl) + 1, output_tokens_source=source,
                         cached_tokens=cached)


def failed(i: int, kind: FailureKind) -> RequestRecord:
    return RequestRecord(request_id=f"f{i}", worker="local", profile="steady", scheduled_unix=1000.0 + i,
                         outcome=Outcome.FAILED, failure_kind=kind, end_s=0.5, error="x")


def info(**kw) -> RunInfo:
    base = dict(profile="steady", endpoint="chat", host="http://h", model="m",
                slo={"ttft_ms": None, "tpot_ms": None, "e2e_ms": None}, block_size=16)
    return RunInfo(**{**base, **kw})


def test_distribution_is_numpy_linear_at_full_precision():
    d = distribution([0.1, 0.2, 0.3, 0.4])
    assert d["p50"] == pytest.approx(0.25)
    assert d["p90"] == pytest.approx(0.37)
    assert d["p99"] == pytest.approx(0.397)
    assert (d["count"], d["min"], d["max"]) == (4, 0.1, 0.4)
    assert distribution([])["p50"] is None


def test_summary_counts_throughput_and_goodput():
    records = [ok(0, 0.1, [0.05, 0.05]), ok(1, 0.3, [0.02, 0.02]), ok(2, 0.2, [0.2, 0.2]),
               failed(3, FailureKind.STREAM_CUT), failed(3, FailureKind.STREAM_CUT),
               failed(4, FailureKind.HTTP_STATUS)]
    records.append(RequestRecord(request_id="a", worker="local", profile="steady", scheduled_unix=1004.0,
                                 outcome=Outcome.ABORTED, end_s=0.1))
    s = summarize(records, info(slo={"ttft_ms": 250, "tpot_ms": 100, "e2e_ms": None}))
    assert s["duration_s"] == pytest.approx(4.5)  # 1000.0 to 1004.0 + 0.5
    assert (s["num_requests"], s["num_succeeded"], s["num_failed"], s["num_aborted"]) == (7, 3, 3, 1)
    assert s["failures"] == {"http_status": 1, "error_event": 0, "stream_cut": 2, "timeout": 0,
                             "connect_error": 0}
    assert s["ttft_s"]["p50"] == pytest.approx(0.2)
    assert s["itl_s"]["count"] == 6
    assert s["tpot_s"]["max"] == pytest.approx(0.2)
    # r0 meets both; r1 misses TTFT (300 ms); r2 misses TPOT (200 ms).
    assert s["num_good"] == 1
    assert s["goodput_rps"] == pytest.approx(1 / 4.5)
    assert s["request_throughput_rps"] == pytest.approx(3 / 4.5)
    assert s["output_token_throughput_tps"] == pytest.approx(9 / 4.5)
    assert s["total_token_throughput_tps"] == pytest.approx(309 / 4.5)
    assert s["output_tokens_estimated"] is False


def test_chunk_counted_tokens_are_flagged_and_no_slo_means_no_goodput():
    s = summarize([ok(0, 0.1, [0.1], source=TokenSource.CHUNKS)], info())
    assert s["output_tokens_estimated"] is True
    assert s["output_tokens_source"] == {"usage": 0, "chunks": 1}
    assert s["goodput_rps"] is None and s["num_good"] is None


def test_best_possible_prefix_hit_rate_is_block_aligned_and_excludes_the_first_request():
    records = [ok(i, 0.1, [0.1], prompt=100, cached=0 if i == 0 else 80) for i in range(4)]
    s = summarize(records, info(profile="shared-prefix", shared_prefix_tokens=90.0))
    # 90 shared tokens -> 5 full blocks of 16 = 80 per request, 3 of the 4 requests hit.
    assert s["prefix_cache"]["best_possible_hit_rate"] == pytest.approx(240 / 400)
    assert s["prefix_cache"]["measured_hit_rate"] == pytest.approx(240 / 400)
    dynamic = summarize(records, info(profile="dynamic-prefix"))
    assert dynamic["prefix_cache"]["best_possible_hit_rate"] == 0.0


def test_write_report_files(tmp_path):
    records = [ok(0, 0.1, [0.05, 0.06]), failed(1, FailureKind.TIMEOUT)]
    write_report(records, info(), tmp_path / "out")
    out = tmp_path / "out"
    summary = json.loads((out / SUMMARY_JSON).read_text())
    assert summary["failures"]["timeout"] == 1
    assert "| TTFT | 1 | 100.000 |" in (out / SUMMARY_MD).read_text()
    rows = list(csv.DictReader(open(out / REQUESTS_CSV)))
    assert [r["outcome"] for r in rows] == ["ok", "failed"]
    assert rows[0]["itl_s"] == "0.05 0.06" and rows[1]["failure_kind"] == "timeout"
    for name in ("loadgen_latency.png", "loadgen_throughput.png", "loadgen_concurrency.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_markdown_says_what_was_measured_never_python_values():
    records = [ok(0, 0.1, [0.05, 0.06], cached=None, source=TokenSource.CHUNKS),
               RequestRecord(request_id="cut", worker="local", profile="steady", scheduled_unix=1000.5,
                             outcome=Outcome.INCOMPLETE, ttft_s=0.1, itl_s=[0.05], num_chunks=2, end_s=0.2)]
    text = markdown(summarize(records, info(model=None, client_cpu_warning=True, max_client_cpu_percent=97.0)))
    assert "None" not in text and "{" not in text
    assert "- Goodput: no SLO given (--slo-ttft-ms, --slo-tpot-ms, --slo-e2e-ms)" in text
    assert "**The client was CPU-bound**: Locust measured a client process above 90% CPU (peak 97%)" in text
    assert "**Output tokens estimated** for 1 requests" in text
    assert "1 cut by the end of the test (still streaming when it stopped" in text
    assert "measured not reported by the server, best possible not estimated for this profile" in text
    assert "model not known" in text
    with_slo = markdown(summarize(records[:1], info(slo={"ttft_ms": 250.0, "tpot_ms": None, "e2e_ms": 900.0})))
    assert "- Goodput: 4.762 req/s (1 of 1 requests meeting TTFT <= 250 ms, E2E <= 900 ms)" in with_slo  # 1 in 0.21 s
    assert "CPU-bound" not in with_slo and "None" not in with_slo


def test_incomplete_streams_count_in_throughput_over_time_not_in_latency():
    # Three requests of 4 s each, every 0.5 s of them streaming a token, stopped 2.5 s in.
    records = [RequestRecord(request_id=f"c{i}", worker="local", profile="steady", scheduled_unix=1000.0,
                             outcome=Outcome.INCOMPLETE, ttft_s=0.5, itl_s=[0.5] * 3, num_chunks=4, end_s=2.5)
               for i in range(3)]
    s = summarize(records, info())
    assert s["num_incomplete"] == 3 and s["ttft_s"]["count"] == 0
    ts = time_series(records)
    assert ts.seconds == [0.0, 1.0, 2.0]
    # Tokens at 0.5, 1.0, 1.5, 2.0 s: 3, 6, 3 per bucket; the last bucket covers 0.5 s, so 3 / 0.5.
    assert ts.tokens_per_s == [3.0, 6.0, 6.0]
    assert ts.in_flight == [3, 3, 3]
