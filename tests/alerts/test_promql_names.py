"""The PromQL name extractor the contract test relies on: it must find every name and nothing else."""

from promql_names import metric_names


def test_names_inside_functions_and_aggregations():
    expr = ('sum by (instance, model, le) (label_replace(rate(vllm:ttft_seconds_bucket{le="2.5", a=~"x|y"}[5m]), '
            '"model", "$1", "model_name", "(.*)")) / on (instance) group_left () (up{job="llm-engine"} > 0)')
    assert metric_names(expr) == {"vllm:ttft_seconds_bucket", "up"}


def test_keywords_numbers_durations_and_variables_are_not_names():
    expr = ('llm:a:rate5m < 0.5 * llm:b offset 10m and on (instance) c_total unless d > bool 1e3 '
            'or count_values by (gpu) ("xid", e) or vector(0) or llm:x{instance=~"$instance"}[$__rate_interval]')
    assert metric_names(expr) == {"llm:a:rate5m", "llm:b", "c_total", "d", "e", "llm:x"}


def test_histogram_quantile_and_time():
    assert metric_names("histogram_quantile(0.99, llm:ttft_seconds_bucket:rate5m) - time()") == {
        "llm:ttft_seconds_bucket:rate5m"}
