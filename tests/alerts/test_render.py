"""alerts/render.py: one runbook base, rewritten everywhere; Kubernetes manifests that agree with the rules."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml
from alerts_support import ROOT


def test_committed_files_are_up_to_date(render):
    assert render.stale(render.render(ROOT)) == []
    assert render.run(["--check"]) == 0


def test_prometheusrule_holds_exactly_the_source_groups(render):
    manifest = yaml.safe_load((ROOT / "alerts" / "k8s" / "prometheusrule.yaml").read_text())
    assert (manifest["apiVersion"], manifest["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    source = [g for path in render.rule_files(ROOT) for g in render.load_groups(path)]
    assert manifest["spec"]["groups"] == source


def test_servicemonitors_set_the_contract_job_names():
    docs = list(yaml.safe_load_all((ROOT / "alerts" / "k8s" / "servicemonitors.yaml").read_text()))
    jobs = {}
    for doc in docs:
        assert doc["kind"] == "ServiceMonitor"
        (endpoint,) = doc["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics"
        (relabel,) = endpoint["relabelings"]
        assert relabel["targetLabel"] == "job"
        jobs[doc["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]] = relabel["replacement"]
    assert jobs == {"llmserve": "llm-engine", "llm-gpu-exporter": "llm-gpu-exporter"}


@pytest.fixture
def checkout(tmp_path):
    """A copy of alerts/ to render into."""
    shutil.copytree(ROOT / "alerts", tmp_path / "alerts", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_changing_the_base_rewrites_rules_tests_and_manifest(render, checkout, promtool):
    config = checkout / "alerts" / "config.yml"
    config.write_text("runbook_base: https://wiki.example.com/sre/llm/\n")
    assert render.run(["--check", "--root", str(checkout)]) == 1
    assert render.run(["--root", str(checkout)]) == 0
    assert render.run(["--check", "--root", str(checkout)]) == 0
    rules = (checkout / "alerts" / "alerts.rules.yml").read_text()
    assert "https://wiki.example.com/sre/llm/LLMEngineDown.md" in rules
    assert "github.com" not in rules
    manifest = (checkout / "alerts" / "k8s" / "prometheusrule.yaml").read_text()
    assert manifest.count("https://wiki.example.com/sre/llm/") == rules.count("https://wiki.example.com/sre/llm/")
    test_text = (checkout / "alerts" / "tests" / "engine.test.yml").read_text()
    assert "https://wiki.example.com/sre/llm/LLMQueueBacklog.md" in test_text
    result = subprocess.run([promtool, "test", "rules", "alerts/tests/engine.test.yml"], cwd=checkout,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("content", ["runbook_base: ''\n", "other: 1\n", "runbook_base: [a\n"])
def test_bad_config_is_one_clear_error(render, checkout, content, capsys):
    (checkout / "alerts" / "config.yml").write_text(content)
    with pytest.raises(render.RenderError, match="config.yml"):
        render.run(["--root", str(checkout)])


def test_cli_reports_bad_config_in_one_line_with_exit_2(checkout):
    (checkout / "alerts" / "config.yml").write_text("runbook_base: 42\n")
    result = subprocess.run([sys.executable, str(ROOT / "alerts" / "render.py"), "--root", str(checkout)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "runbook_base must be a non-empty URL string" in result.stderr
