"""Breadth fixtures: each engine's, gateway's and client's real wordings for every label, one folder each.

tests/triage/fixtures/breadth/<label>/<engine>-<what>/ holds log files written in the format the engine
prints (the decisive line rendered from its source's format string) and expected.json: `first` is the
finding id that must come first (null: a healthy log, where nothing of medium or high confidence may be
found) and `cause` the cache-miss cause. Every folder runs through the real CLI (JSON output)."""

import json
from pathlib import Path

import pytest

BREADTH = Path(__file__).parent / "fixtures" / "breadth"
CASES = sorted(p.parent for p in BREADTH.glob("*/*/expected.json"))
LABELS = {"context-overflow", "stream-cut-client-disconnect", "stream-cut-gateway-timeout",
          "stream-cut-proxy-buffering", "oom-kv-capacity", "oom-weights", "oom-runtime", "engine-crash",
          "kv-preemption", "driver-mismatch", "cache-miss", "queue-backlog", "healthy"}


def test_every_label_has_fixtures():
    assert {c.parent.name for c in CASES} == LABELS
    assert len(CASES) >= 80


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_breadth_fixture(case, diagnose_json):
    want = json.loads((case / "expected.json").read_text())
    logs = sorted(str(p) for p in case.iterdir() if p.name != "expected.json")
    code, doc, err = diagnose_json(*logs)
    assert "Traceback" not in err
    assert code in (0, 1), err
    findings = doc["findings"]
    if want["first"] is None:
        loud = [(f["id"], f["confidence"]) for f in findings if f["confidence"] in ("medium", "high")]
        assert loud == []
        return
    assert findings, f"nothing found, expected {want['first']}"
    first = findings[0]
    assert first["id"] == want["first"], [(f["id"], f["confidence"]) for f in findings]
    if want.get("cause"):
        assert first["cause"] == want["cause"]
    # the folder's label names the finding: the fixture sits where it says
    assert case.parent.name == ("healthy" if want["first"] is None else want["first"])
