"""The fixture corpus: every case's first finding (and cause) against expected.json, scored per class."""

import json
from collections import Counter

import pytest

from tests.triage.conftest import CORPUS
from triage.diagnose import DiagnoseOptions, diagnose

CASES = sorted(p for p in CORPUS.iterdir() if (p / "expected.json").is_file())
MIN_ACCURACY = 0.9


def _label(fid: str | None, cause: str | None) -> str:
    if fid is None:
        return "none"
    return f"{fid}:{cause}" if fid == "cache-miss" else fid


def predict(case) -> str:
    result = diagnose(DiagnoseOptions([str(case)]))
    if not result.findings:
        return "none"
    first = result.findings[0]
    return _label(first.id, first.cause)


def expected(case) -> str:
    doc = json.loads((case / "expected.json").read_text())
    return _label(doc["first"], doc["cause"] if doc["first"] == "cache-miss" else None)


def test_corpus_is_broad():
    labels = {expected(c) for c in CASES}
    assert len(CASES) >= 50
    assert {"none", "oom-weights", "oom-kv-capacity", "oom-runtime", "kv-preemption", "queue-backlog",
            "context-overflow", "stream-cut-gateway-timeout", "stream-cut-client-disconnect",
            "stream-cut-proxy-buffering", "engine-crash", "driver-mismatch", "cache-miss:dynamic-prefix",
            "cache-miss:disabled", "cache-miss:eviction", "cache-miss:routing"} <= labels


def test_per_class_precision_recall_and_accuracy():
    pairs = [(expected(c), predict(c), c.name) for c in CASES]
    correct = sum(1 for e, p, _ in pairs if e == p)
    tp, fp, fn = Counter(), Counter(), Counter()
    for e, p, _ in pairs:
        if e == p:
            tp[e] += 1
        else:
            fp[p] += 1
            fn[e] += 1
    lines = [f"{'class':<36} precision recall  n"]
    for label in sorted(set(tp) | set(fp) | set(fn)):
        precision = tp[label] / (tp[label] + fp[label]) if tp[label] + fp[label] else 0.0
        recall = tp[label] / (tp[label] + fn[label]) if tp[label] + fn[label] else 0.0
        lines.append(f"{label:<36} {precision:9.2f} {recall:6.2f} {tp[label] + fn[label]:2d}")
    accuracy = correct / len(pairs)
    lines.append(f"accuracy {accuracy:.3f} over {len(pairs)} cases")
    print("\n".join(lines))
    misses = [f"{name}: expected {e}, got {p}" for e, p, name in pairs if e != p]
    assert accuracy >= MIN_ACCURACY, "\n".join(misses)


# The cases a game day reproduces must each be right, not just on average.
GAMEDAY = [c for c in CASES if c.name in {
    "healthy-engine-nginx", "kv-preemption-engine", "kv-capacity-startup", "queue-backlog-engine",
    "gateway-timeout-engine", "client-disconnect-engine", "proxy-buffering-engine", "dynamic-prefix-engine",
    "engine-crash-engine", "runtime-oom-engine", "replica-down"} or c.name.startswith("real-")]


def test_gameday_cases_present():
    assert len(GAMEDAY) == 24  # 11 written from the formats, 13 captured from real game-day runs


@pytest.mark.parametrize("case", GAMEDAY, ids=[c.name for c in GAMEDAY])
def test_gameday_case(case):
    assert predict(case) == expected(case)
