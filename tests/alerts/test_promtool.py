"""promtool (Debian 2.42) accepts every shipped rule file and passes every unit test in alerts/tests."""

from __future__ import annotations

import subprocess

import yaml
from alerts_support import ROOT


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_check_rules_accepts_every_rule_file(promtool, render):
    files = [str(p.relative_to(ROOT)) for p in render.rule_files(ROOT)]
    assert len(files) == 6
    result = _run([promtool, "check", "rules", *files])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files)


def test_unit_tests_pass(promtool):
    tests = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "alerts" / "tests").glob("*.test.yml"))
    assert len(tests) >= 6
    result = _run([promtool, "test", "rules", *tests])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(tests)


def test_unit_tests_can_fail(promtool, tmp_path):
    """A wrong runbook link in an expectation is caught: the tests compare annotations exactly."""
    src = ROOT / "alerts" / "tests" / "gpu.test.yml"
    doc = yaml.safe_load(src.read_text())
    doc["rule_files"] = [str(ROOT / "alerts" / name.removeprefix("../")) for name in doc["rule_files"]]
    case = doc["tests"][0]["alert_rule_test"][1]
    case["exp_alerts"][0]["exp_annotations"]["runbook_url"] = "https://example.org/wrong.md"
    bad = tmp_path / "bad.test.yml"
    bad.write_text(yaml.safe_dump(doc))
    result = _run([promtool, "test", "rules", str(bad)])
    assert result.returncode == 1
    assert "https://example.org/wrong.md" in result.stdout + result.stderr


def test_prometheusrule_spec_passes_check_rules(promtool, tmp_path):
    manifest = yaml.safe_load((ROOT / "alerts" / "k8s" / "prometheusrule.yaml").read_text())
    plain = tmp_path / "from-k8s.rules.yml"
    plain.write_text(yaml.safe_dump({"groups": manifest["spec"]["groups"]}))
    result = _run([promtool, "check", "rules", str(plain)])
    assert result.returncode == 0, result.stdout + result.stderr
