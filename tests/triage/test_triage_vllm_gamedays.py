"""Real vLLM 0.32 game-day logs (tests/triage/fixtures/vllm-0.32): each scenario's cause is named first from
vLLM's own log, nginx's logs, the client log and the /metrics snapshot, through the CLI; healthy stays quiet."""

import shutil
from pathlib import Path

import pytest
import yaml

VLLM = Path(__file__).parent / "fixtures" / "vllm-0.32"
SCENARIOS = sorted(p for p in VLLM.iterdir() if (p / "case.yaml").is_file())


def test_every_game_day_scenario_is_labelled():
    assert {p.name for p in SCENARIOS} == {p.name for p in VLLM.iterdir() if p.is_dir()}
    assert len(SCENARIOS) >= 10


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[p.name for p in SCENARIOS])
def test_vllm_game_day_first_finding(scenario, tmp_path, diagnose_json):
    label = yaml.safe_load((scenario / "case.yaml").read_text())
    folder = tmp_path / scenario.name
    shutil.copytree(scenario, folder, ignore=shutil.ignore_patterns("case.yaml", "expected.json", "README.md"))
    code, doc, err = diagnose_json(str(folder))
    assert "Traceback" not in err
    findings = doc["findings"]
    if label["label"] == "healthy":
        assert [f["id"] for f in findings if f["confidence"] in ("medium", "high")] == []
        return
    assert findings, err
    assert findings[0]["id"] == label["label"], [(f["id"], f["confidence"]) for f in findings]
    assert findings[0].get("cause") == label.get("cause")


def _stats(rates_kv) -> str:
    return "".join(
        f"(APIServer pid=9483) INFO 12-01 22:{28 + i // 6:02d}:{i % 6}4 [loggers.py:335] Engine 000: Avg prompt "
        f"throughput: 321.4 tokens/s, Avg generation throughput: 54.9 tokens/s, Running: 2 reqs, Waiting: 0 reqs, "
        f"CPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: {rate:.1f}%\n" for i, (rate, kv) in enumerate(rates_kv))


@pytest.mark.parametrize("rates_kv, hint", [
    ([(40.0, 0.1), (41.7, 0.1), (24.0, 0.1), (20.0, 0.1)], True),  # fell with room in the KV cache
    ([(40.0, 0.1), (41.7, 0.1), (38.0, 0.1), (36.0, 0.1)], False),  # still high
    ([(10.0, 0.1), (12.0, 0.1), (8.0, 0.1), (7.0, 0.1)], False),  # never shared much: nothing fell
    ([(40.0, 0.1), (41.7, 95.0), (24.0, 95.0), (20.0, 0.1)], False),  # KV full meanwhile: not this hint
])
def test_a_falling_hit_rate_with_kv_room_is_a_low_dynamic_prefix_hint(rates_kv, hint, tmp_path, diagnose_json):
    (tmp_path / "engine-0.log").write_text(_stats(rates_kv))
    code, doc, err = diagnose_json(str(tmp_path))
    got = [(f["id"], f.get("cause"), f["confidence"]) for f in doc["findings"] if f["id"] == "cache-miss"]
    assert got == ([("cache-miss", "dynamic-prefix", "low")] if hint else []), err


def test_vllm_debug_prompt_lines_show_the_changing_start(tmp_path, diagnose_json):
    """At --log-level DEBUG vLLM logs each prompt ('Request <id> details: prompt: ...'): a timestamp at its
    start is then shown, and the hint becomes a finding."""
    (tmp_path / "engine-0.log").write_text("".join(
        f"(APIServer pid=9483) DEBUG 12-01 22:28:{10 + i} [request_logger.py:55] Request chatcmpl-loadgen-{i:016x} "
        f"details: prompt: '[2026-12-01T22:28:{10 + i}.{i}23Z] You are a support assistant for Acme. Answer "
        f"briefly, cite the help centre, and never ask for the password itself. Question {i}: how do I reset it?', prompt_token_ids: [1, 2, 3], prompt_embeds shape: "
        f"None.\n" for i in range(6)) + _stats([(40.0, 0.1), (41.7, 0.1), (24.0, 0.1), (20.0, 0.1)]))
    code, doc, err = diagnose_json(str(tmp_path))
    first = doc["findings"][0]
    assert (first["id"], first["cause"], first["confidence"]) == ("cache-miss", "dynamic-prefix", "high"), err
