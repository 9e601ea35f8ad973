"""loadgen against an engine's own histograms (gameday.agreement): the median bucket of a histogram
delta, its edges, and the whole comparison on real vLLM 0.32 exposition text."""

from pathlib import Path

import pytest

from gameday import agreement
from gameday.agreement import Histogram, delta, in_bucket, median_bucket

VLLM_METRICS = Path(__file__).resolve().parents[1] / "alerts" / "fixtures" / "vllm-0.32.0-metrics.txt"
INF = float("inf")


def hist(edges, cumulative, total=0.0):
    return Histogram(edges=[*edges, INF], cumulative=[*cumulative, cumulative[-1]], sum=total, count=cumulative[-1])


def test_median_of_an_odd_count_is_the_bucket_of_the_middle_sample():
    # 5 samples: 1 in (0, 0.01], 3 in (0.01, 0.025], 1 in (0.025, 0.05]; the middle one (rank 2) is in the second
    assert median_bucket(hist([0.01, 0.025, 0.05], [1, 4, 5])) == (0.01, 0.025)


def test_median_of_an_even_count_spans_both_middle_samples_buckets():
    # 4 samples, 2 at or under 0.01 and 2 above: the median is the mean of ranks 1 and 2, anywhere in (0, 0.025]
    assert median_bucket(hist([0.01, 0.025, 0.05], [2, 4, 4])) == (0.0, 0.025)
    # both middle samples in one bucket: that bucket alone
    assert median_bucket(hist([0.01, 0.025, 0.05], [1, 3, 4])) == (0.01, 0.025)


def test_first_bucket_starts_at_zero_and_a_single_sample_is_its_own_median():
    assert median_bucket(hist([0.01, 0.025], [1, 1])) == (0.0, 0.01)


def test_median_beyond_the_last_edge_is_open_ended():
    h = Histogram(edges=[0.01, INF], cumulative=[0, 3], sum=3.0, count=3)
    assert median_bucket(h) == (0.01, INF)


def test_empty_histogram_has_no_median():
    assert median_bucket(hist([0.01, 0.025], [0, 0])) is None


def test_bucket_edges_follow_prometheus_le_lower_excluded_upper_included():
    assert in_bucket(0.025, (0.01, 0.025))
    assert not in_bucket(0.01, (0.01, 0.025))
    assert in_bucket(0.0100001, (0.01, 0.025))
    assert not in_bucket(0.0250001, (0.01, 0.025))


def test_delta_subtracts_counts_sum_and_count_and_refuses_changed_edges():
    before = hist([0.01, 0.025], [3, 5], total=0.1)
    after = hist([0.01, 0.025], [4, 9], total=0.2)
    d = delta(before, after)
    assert d.cumulative == [1, 4, 4] and d.count == 4 and d.sum == pytest.approx(0.1)
    with pytest.raises(agreement.ExpositionError, match="bucket edges changed"):
        delta(before, hist([0.01, 0.05], [4, 9]))


def test_real_vllm_exposition_sums_label_sets_and_reads_counters():
    families = agreement.parse_exposition(VLLM_METRICS.read_text())
    ttft = agreement.histogram(families, "vllm:time_to_first_token_seconds")
    assert ttft.count == 71 and ttft.edges[:4] == [0.001, 0.005, 0.01, 0.02] and ttft.edges[-1] == INF
    assert median_bucket(ttft) == (0.04, 0.06)  # rank 35: cumulative 34 at 0.04, 42 at 0.06
    assert agreement.counter(families, "vllm:generation_tokens") == 21001
    assert agreement.counter(families, "vllm:request_success") == 71
    assert agreement.histogram(families, "vllm:no_such_histogram") is None


def _exposition(ttft_counts, itl_counts, per_request_counts, tokens, requests):
    """A vLLM-shaped /metrics text: TTFT, ITL, TPOT (as ITL) and E2E histograms, tokens and requests."""
    lines = []

    def add(name, edges, counts, mean=0.01):
        lines.append(f"# TYPE {name} histogram")
        for edge, count in zip([*edges, "+Inf"], [*counts, counts[-1]], strict=True):
            lines.append(f'{name}_bucket{{engine="0",le="{edge}",model_name="m"}} {count}')
        lines.append(f'{name}_count{{engine="0",model_name="m"}} {counts[-1]}')
        lines.append(f'{name}_sum{{engine="0",model_name="m"}} {mean * counts[-1]}')

    add("vllm:time_to_first_token_seconds", [0.02, 0.04, 0.06], ttft_counts)
    add("vllm:inter_token_latency_seconds", [0.01, 0.025], itl_counts)
    add("vllm:request_time_per_output_token_seconds", [0.01, 0.025], per_request_counts)
    add("vllm:e2e_request_latency_seconds", [0.3, 0.5], per_request_counts, mean=0.205)
    lines += ["# TYPE vllm:generation_tokens_total counter", f'vllm:generation_tokens_total{{model_name="m"}} {tokens}',
              "# TYPE vllm:request_success_total counter",
              f'vllm:request_success_total{{finished_reason="length",model_name="m"}} {requests}',
              'vllm:request_success_total{finished_reason="stop",model_name="m"} 0']
    return "\n".join(lines) + "\n"


def _summary(**over):
    base = {"num_succeeded": 4, "num_failed": 0, "num_incomplete": 0, "num_aborted": 0, "total_output_tokens": 12,
            "output_tokens_source": {"usage": 4, "chunks": 0},
            "ttft_s": {"count": 4, "p50": 0.03, "mean": 0.035}, "itl_s": {"count": 8, "p50": 0.005, "mean": 0.006},
            "tpot_s": {"count": 4, "p50": 0.005, "mean": 0.006}, "e2e_s": {"count": 4, "p50": 0.2, "mean": 0.21}}
    return {**base, **over}


BEFORE = _exposition([1, 2, 2], [3, 3], [2, 2], tokens=100, requests=10)
AFTER = _exposition([1, 5, 6], [11, 11], [6, 6], tokens=112, requests=14)  # +4 requests, TTFT median in (20, 40] ms


def test_compare_agrees_when_p50s_lie_in_the_buckets_and_tokens_match():
    result = agreement.compare(BEFORE, AFTER, _summary())
    assert result.failures == []
    assert [r.metric for r in result.rows] == ["TTFT", "ITL", "TPOT", "E2E"]
    ttft = result.rows[0]
    assert ttft.bucket == (0.02, 0.04) and ttft.engine_count == 4 and ttft.agrees
    assert ttft.engine_mean_s == pytest.approx(0.01) and ttft.mean_offset_s == pytest.approx(0.025)
    assert result.engine_output_tokens == 12 and result.engine_requests == 4
    assert ttft.outside_s == pytest.approx(0.005)  # loadgen's E2E mean 210 ms, vLLM's 205 ms
    assert ("| TTFT | `vllm:time_to_first_token_seconds` | 4 / 4 | (20, 40] ms (+5.00 ms outside vLLM's timers, "
            "from E2E) | 30.00 ms | yes |") in agreement.table(result)
    assert [r.outside_s for r in result.rows[1:]] == [None, None, None]


def test_ttft_may_exceed_the_bucket_by_what_the_client_adds_to_e2e_and_no_more():
    # vLLM's E2E mean is 205 ms; loadgen's 210 ms: 5 ms of each request are outside vLLM's timers
    assert agreement.compare(BEFORE, AFTER, _summary(ttft_s={"count": 4, "p50": 0.0449, "mean": 0.04})).failures == []
    failures = agreement.compare(BEFORE, AFTER, _summary(ttft_s={"count": 4, "p50": 0.0451, "mean": 0.04})).failures
    assert failures == ["TTFT: loadgen p50 45.10 ms is not in the bucket (20, 40] ms (+5.00 ms outside vLLM's "
                        "timers, from E2E) holding the median of vllm:time_to_first_token_seconds"]
    # a client whose E2E is not behind vLLM's gets nothing on top
    early = _summary(ttft_s={"count": 4, "p50": 0.041, "mean": 0.04}, e2e_s={"count": 4, "p50": 0.2, "mean": 0.2})
    result = agreement.compare(BEFORE, AFTER, early)
    assert result.rows[0].outside_s is None
    assert result.failures == ["TTFT: loadgen p50 41.00 ms is not in the bucket (20, 40] ms holding the median of "
                               "vllm:time_to_first_token_seconds"]


def test_compare_names_each_disagreement():
    summary = _summary(ttft_s={"count": 4, "p50": 0.046, "mean": 0.04}, total_output_tokens=11,
                       output_tokens_source={"usage": 3, "chunks": 1}, num_incomplete=1)
    failures = agreement.compare(BEFORE, AFTER, summary).failures
    assert "TTFT: loadgen p50 46.00 ms is not in the bucket (20, 40] ms (+5.00 ms outside vLLM's timers, from E2E) " \
           "holding the median of vllm:time_to_first_token_seconds" in failures
    assert "output tokens: the engine generated 12, loadgen's usage says 11" in failures
    assert "loadgen: output tokens of 1 of 4 requests were counted from chunks, not from the stream's usage" in failures
    assert "loadgen: 1 requests cut by the end of the test: the engine's histograms do not hold them alike" in failures


def test_compare_says_which_histogram_the_engine_lacks():
    text = AFTER.replace("vllm:request_time_per_output_token_seconds", "vllm:other_seconds")
    before = BEFORE.replace("vllm:request_time_per_output_token_seconds", "vllm:other_seconds")
    assert "the engine's /metrics has no histogram for TPOT" in agreement.compare(before, text, _summary()).failures


def test_unreadable_exposition_is_one_clear_error():
    with pytest.raises(agreement.ExpositionError, match="cannot parse the /metrics text"):
        agreement.compare("vllm:x{le=\n", AFTER, _summary())
