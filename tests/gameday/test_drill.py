"""Drill rules: exact duration scaling, floors, and promtool acceptance of the copies."""

import shutil
from pathlib import Path

import pytest
import yaml

from gameday import drill
from gameday.errors import DrillRuleError

SAMPLE = """\
groups:
  - name: llm-sample
    interval: 30s
    rules:
      - record: llm:ttft_seconds:p99_5m
        expr: histogram_quantile(0.99, sum by (le, instance, model) (rate(llm_time_to_first_token_seconds_bucket[5m])))
      - alert: LLMPrefixCacheHitRateLow
        expr: |
          llm:prefix_hit_ratio:rate5m < 0.5 * (llm:prefix_hit_ratio:rate5m offset 1h)
          and avg_over_time(llm:prefix_hit_ratio:rate5m[1h:5m]) > 0.3
          and rate(llm_prefix_cache_queried_tokens_total{instance=~"a[0-9]"}[1m]) > 10
        for: 10m
        keep_firing_for: 2m
        labels: {severity: warning}
        annotations:
          summary: hit rate fell over 5m
          runbook_url: https://example.org/runbooks/LLMPrefixCacheHitRateLow
"""


@pytest.mark.parametrize(("text", "ms"), [("5m", 300_000), ("1h30m", 5_400_000), ("250ms", 250), ("3d", 259_200_000)])
def test_parse_duration(text, ms):
    assert drill.parse_duration_ms(text) == ms


@pytest.mark.parametrize(("ms", "text"), [(5_000, "5s"), (90_000, "1m30s"), (1_500, "1s500ms"), (0, "0s"), (4_320_000, "1h12m")])
def test_format_duration(ms, text):
    assert drill.format_duration_ms(ms) == text


def test_bad_duration_is_typed_error():
    with pytest.raises(DrillRuleError, match="not a Prometheus duration: '5 minutes'"):
        drill.parse_duration_ms("5 minutes")


def test_rewrite_expr_scales_ranges_subqueries_offsets_and_clamps():
    expr = "rate(x[5m]) / rate(x[1m]) and y offset 1h and avg_over_time(z[6h:5m]) and w[30s:] and v offset -2m"
    assert drill.rewrite_expr(expr, 60) == (
        "rate(x[5s]) / rate(x[4s]) and y offset 1m and avg_over_time(z[6m:5s]) and w[4s:] and v offset -2s"
    )


def test_rewrite_expr_leaves_numbers_and_label_regexes_alone():
    expr = 'time() - x{instance=~"h[0-9]"} > 300 and foo_offset 5'
    assert drill.rewrite_expr(expr, 60) == expr


def test_rewrite_rules_sample_file_exactly():
    doc = drill.rewrite_rules(yaml.safe_load(SAMPLE), 60)
    group = doc["groups"][0]
    assert group["interval"] == "1s"
    rec, alert = group["rules"]
    assert rec["expr"].endswith("rate(llm_time_to_first_token_seconds_bucket[5s])))")
    assert alert["expr"] == (
        "llm:prefix_hit_ratio:rate5m < 0.5 * (llm:prefix_hit_ratio:rate5m offset 1m)\n"
        "and avg_over_time(llm:prefix_hit_ratio:rate5m[1m:5s]) > 0.3\n"
        'and rate(llm_prefix_cache_queried_tokens_total{instance=~"a[0-9]"}[4s]) > 10\n'
    )
    assert (alert["for"], alert["keep_firing_for"]) == ("10s", "2s")
    assert alert["annotations"]["summary"] == "hit rate fell over 5m"  # text is not PromQL
    assert rec["record"] == "llm:ttft_seconds:p99_5m"  # names unchanged: dashboards still match


def test_not_a_rule_file():
    with pytest.raises(DrillRuleError, match="no top-level 'groups' list"):
        drill.rewrite_rules({"rules": []})


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_drill_copy_passes_promtool(tmp_path):
    src = tmp_path / "sample.rules.yml"
    src.write_text(SAMPLE)
    (out,) = drill.write_drill_copies([src], tmp_path / "drill")
    assert out.read_text().startswith("# drill copy of sample.rules.yml: every duration divided by 60")
    assert "SUCCESS: 2 rules found" in drill.promtool_check([out])


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_shipped_rules_drill_copies_pass_promtool(tmp_path):
    root = Path(__file__).resolve().parents[2]
    sources = drill.shipped_rule_files(root)
    if not sources:
        pytest.skip("no shipped rule files in alerts/ yet")
    written = drill.write_drill_copies(sources, tmp_path / "drill")
    drill.promtool_check(written)
    for src, dest in zip(sources, written, strict=True):
        shipped = yaml.safe_load(src.read_text())
        copy = yaml.safe_load(dest.read_text())
        names = [r.get("alert") or r.get("record") for g in shipped["groups"] for r in g["rules"]]
        assert names == [r.get("alert") or r.get("record") for g in copy["groups"] for r in g["rules"]]
