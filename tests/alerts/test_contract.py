"""Contract: every series a rule or panel reads has a producer; every alert is complete and has a runbook."""

from __future__ import annotations

import re

import pytest
import yaml
from alerts_support import ROOT, rules_in
from promql_names import metric_names

from dashboards.boards import boards
from dashboards.grafana import board_json

ALERTS = ROOT / "alerts"
NATIVE_FILES = [ALERTS / "engine.rules.yml", ALERTS / "gpu.rules.yml"]
ADAPTER_PREFIX = {"vllm.rules.yml": "vllm:", "sglang.rules.yml": "sglang:", "dcgm.rules.yml": "DCGM_"}
# What each adapter may read, as exposed by that software (see docs/alerts.md for the sources:
# vllm/v1/metrics/loggers.py, sglang/srt/metrics/collector.py, dcgm-exporter's default-counters.csv).
EXTERNAL = {
    "vllm.rules.yml": {
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc", "vllm:request_success_total", "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total", "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_bucket",
        "vllm:time_per_output_token_seconds_bucket", "vllm:request_time_per_output_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket", "vllm:request_queue_time_seconds_bucket",
        "vllm:num_requests_waiting_by_reason", "vllm:engine_sleep_state", "vllm:admission_rejections_total",
        "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total",
        "vllm:time_in_queue_requests_bucket", "http_requests_total"},
    "sglang.rules.yml": {
        "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:num_requests_total",
        "sglang:num_aborted_requests_total", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
        "sglang:cached_tokens_total", "sglang:time_to_first_token_seconds_bucket",
        "sglang:time_to_first_token_seconds_count", "sglang:inter_token_latency_seconds_bucket",
        "sglang:e2e_request_latency_seconds_bucket", "sglang:queue_time_seconds_bucket"},
    "dcgm.rules.yml": {
        "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_EXP_CLOCK_EVENTS_COUNT",
        "DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"},
}
SECTIONS = ["## Meaning", "## Impact", "## Diagnosis", "## Mitigation"]


def _contract_names(section: str) -> set[str]:
    """Backticked llm_* metric names in one section of docs/CONTRACTS.md."""
    text = (ROOT / "docs" / "CONTRACTS.md").read_text()
    body = text.split(f"## {section}.", 1)[1].split("\n## ", 1)[0]
    return {m for m in re.findall(r"`(llm_[a-z0-9_]+)", body)}


def _produced(base: set[str]) -> set[str]:
    """Names plus the _bucket/_sum/_count series a histogram among them exposes."""
    return base | {f"{name}{suffix}" for name in base for suffix in ("_bucket", "_sum", "_count")}


def _all_rule_files():
    return NATIVE_FILES + [ALERTS / "alerts.rules.yml"] + [ALERTS / "adapters" / f for f in ADAPTER_PREFIX]


def _recorded() -> set[str]:
    return {r["record"] for path in _all_rule_files() for r in rules_in(path) if "record" in r}


def _alerts() -> list[dict]:
    return [r for r in rules_in(ALERTS / "alerts.rules.yml") if "alert" in r]


def _panel_exprs() -> list[tuple[str, str, str]]:
    out = []
    for board in boards():
        for panel in board_json(board)["panels"]:
            out += [(board.uid, panel["title"], t["expr"]) for t in panel.get("targets", [])]
    return out


def test_contract_sections_parse():
    engine, exporter = _contract_names("2"), _contract_names("3")
    assert {"llm_kv_cache_usage_ratio", "llm_engine_ready", "llm_time_to_first_token_seconds"} <= engine
    assert {"llm_gpu_memory_used_bytes", "llm_gpu_xid_errors_total", "llm_gpu_throttle_reason"} <= exporter


def test_native_rules_read_only_contract_names_that_the_code_exports():
    from engine.obs.metrics import SPECS as ENGINE_SPECS
    from exporters.families import SPECS as GPU_SPECS

    engine = _produced(_contract_names("2")) & _produced({s.name for s in ENGINE_SPECS})
    exporter = _produced(_contract_names("3")) & _produced({s.name for s in GPU_SPECS})
    allowed = {"engine.rules.yml": engine, "gpu.rules.yml": exporter}
    recorded = _recorded()
    for path in NATIVE_FILES:
        for rule in rules_in(path):
            unknown = metric_names(rule["expr"]) - allowed[path.name] - recorded
            assert not unknown, f"{path.name} {rule.get('record')}: reads {unknown}, produced by nothing"


def test_adapters_read_only_their_own_source_and_record_only_known_llm_names():
    native = {r["record"] for path in NATIVE_FILES for r in rules_in(path) if "record" in r}
    for name, allowed in EXTERNAL.items():
        for rule in rules_in(ALERTS / "adapters" / name):
            read = metric_names(rule["expr"])
            assert read and read <= allowed, f"{name} {rule['record']}: reads {read - allowed}"
            assert rule["record"] in native, f"{name}: {rule['record']} is no llmsre series"


def test_no_llm_series_has_two_producers_for_one_target():
    """Rules recording one name each read one distinct source family, so one target never gets two."""
    families: dict[str, list[str]] = {}
    for path in _all_rule_files():
        for rule in rules_in(path):
            if "record" not in rule:
                continue
            read = metric_names(rule["expr"])
            prefixes = {p for p in ("llm:", "llm_", "vllm:", "sglang:", "DCGM_") if any(n.startswith(p) for n in read)}
            assert len(prefixes) == 1, f"{path.name} {rule['record']} mixes sources {prefixes}"
            key = rule["record"] + str(sorted((rule.get("labels") or {}).items()))
            families.setdefault(key, []).append(prefixes.pop())
    for record, sources in families.items():
        assert len(sources) == len(set(sources)), f"{record} recorded twice from {sources}"


def test_alerts_and_panels_read_only_llm_series_and_up_that_rules_record():
    recorded = _recorded()
    reads = [(a["alert"], a["expr"]) for a in _alerts()] + [(f"{b}/{t}", e) for b, t, e in _panel_exprs()]
    for where, expr in reads:
        names = metric_names(expr)
        assert names, f"{where}: reads nothing"
        assert names <= recorded | {"up"}, f"{where}: reads {names - recorded - {'up'}}"


def test_every_recorded_series_is_shown_or_alerted_on():
    used = set()
    for _, _, expr in _panel_exprs():
        used |= metric_names(expr)
    for rule in rules_in(ALERTS / "alerts.rules.yml") + [r for p in NATIVE_FILES for r in rules_in(p)]:
        used |= metric_names(rule["expr"])
    unused = _recorded() - used
    assert not unused, f"recorded but never read: {sorted(unused)}"


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: f"{a['alert']}-{a['labels']['severity']}")
def test_alert_is_complete(alert, render):
    assert alert["alert"].startswith("LLM") and re.fullmatch(r"[A-Za-z0-9]+", alert["alert"])
    assert alert["labels"]["severity"] in {"critical", "warning", "info"}
    assert re.fullmatch(r"(\d+[smhd])+", alert["for"]), alert["for"]
    notes = alert["annotations"]
    assert set(notes) == {"summary", "description", "runbook_url"}
    assert "$value" in notes["description"]
    assert notes["runbook_url"] == f"{render.load_runbook_base(ROOT)}{alert['alert']}.md"


def test_every_alert_has_a_runbook_with_the_four_sections():
    for name in sorted({a["alert"] for a in _alerts()}):
        path = ROOT / "runbooks" / f"{name}.md"
        assert path.exists(), f"no runbook for {name}"
        lines = path.read_text().splitlines()
        assert lines[0] == f"# {name}"
        headings = [line for line in lines if line.startswith("## ")]
        assert headings == SECTIONS, f"{path.name}: sections {headings}"
        body = path.read_text()
        assert "llmtriage diagnose" in body and "```promql" in body, f"{path.name}: no PromQL or triage call"


def test_every_alert_is_tested_firing_and_silent():
    firing, silent = set(), set()
    for path in sorted((ALERTS / "tests").glob("*.test.yml")):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test") or []:
                (firing if case.get("exp_alerts") else silent).add(case["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names <= firing, f"never tested firing: {names - firing}"
    assert names <= silent, f"never tested silent: {names - silent}"


def test_runbook_links_point_at_existing_runbooks():
    for path in sorted((ROOT / "runbooks").glob("LLM*.md")):
        for target in re.findall(r"\]\(([^)#]+\.md)\)", path.read_text()):
            assert (path.parent / target).exists(), f"{path.name} links to missing {target}"
