"""Prompt generator, ShareGPT loading, option checks, load shapes and the Poisson schedule."""

import json
import random
from types import SimpleNamespace

import pytest

from loadgen.options import ConfigError, config_from_options
from loadgen.profiles import ArrivalSchedule, RampShape, SpikeShape, SteadyShape, StepShape, shape_for
from loadgen.prompts import (
    Calibration,
    DatasetError,
    PromptFactory,
    PromptSettings,
    load_sharegpt,
    shared_prefix_text,
)


def factory(profile: str, dataset=None, calibration=None, **kw) -> PromptFactory:
    settings = PromptSettings(profile=profile, prompt_tokens=kw.get("prompt_tokens", 20),
                              output_tokens=kw.get("output_tokens"), prefix_tokens=40, num_turns=3, dataset=dataset)
    return PromptFactory(settings, calibration or Calibration(), random.Random(kw.get("seed", 1)))


def test_generated_prompts_have_the_calibrated_word_count():
    cal = Calibration()
    f = factory("steady", calibration=cal)
    p = f.next_prompt()
    assert len(p.messages[0]["content"].split()) == 20 == p.num_words and p.max_tokens == 128
    cal.observe(20, 30)  # the server counted 1.5 tokens per word
    assert cal.tokens_per_word == pytest.approx(1.5)
    assert len(f.next_prompt().messages[0]["content"].split()) == round(20 / 1.5)


def test_shared_prefix_is_identical_and_dynamic_prefix_starts_unique():
    a, b = factory("shared-prefix", seed=1).next_prompt(), factory("shared-prefix", seed=2).next_prompt()
    assert a.messages[0] == b.messages[0] == {"role": "system", "content": shared_prefix_text(40)}
    assert a.messages[1] != b.messages[1]
    c, d = factory("dynamic-prefix", seed=1).next_prompt(), factory("dynamic-prefix", seed=2).next_prompt()
    assert c.messages[0]["content"][:30] != d.messages[0]["content"][:30]
    assert c.messages[0]["content"].endswith(shared_prefix_text(40))


def test_multi_turn_history_grows_and_restarts():
    f = factory("multi-turn")
    first = f.next_prompt()
    f.on_answer("answer one", ok=True)
    second = f.next_prompt()
    assert second.messages[:2] == [first.messages[0], {"role": "assistant", "content": "answer one"}]
    assert len(second.messages) == 3
    f.on_answer("answer two", ok=True)
    assert len(f.next_prompt().messages) == 5
    f.on_answer("answer three", ok=True)
    assert len(f.next_prompt().messages) == 1  # three turns done: a new conversation


def sharegpt(tmp_path, data) -> str:
    path = tmp_path / "sg.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_sharegpt_entries_and_lengths(tmp_path):
    path = sharegpt(tmp_path, [
        {"id": "a", "conversations": [{"from": "human", "value": "What is KV cache?"},
                                      {"from": "gpt", "value": " ".join(["w"] * 100)},
                                      {"from": "human", "value": "And paging?"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "orphan answer"}]},
    ])
    entries = load_sharegpt(path)
    assert len(entries) == 1
    assert entries[0].turns == ["What is KV cache?", "And paging?"] and entries[0].output_tokens == 130
    p = factory("steady", dataset=entries).next_prompt()
    assert p.messages == [{"role": "user", "content": "What is KV cache?"}] and p.max_tokens == 130
    assert factory("steady", dataset=entries, output_tokens=7).next_prompt().max_tokens == 7


@pytest.mark.parametrize("data, message", [
    ("[{\"conversations\": [}", "not JSON: Expecting value at line 1 column 21"),
    ({"conversations": []}, "expected a JSON list of ShareGPT conversations, got dict"),
    ([{"id": 1}], "no usable ShareGPT conversation"),
])
def test_bad_sharegpt_files_get_one_clear_error(tmp_path, data, message):
    with pytest.raises(DatasetError, match=message):
        load_sharegpt(sharegpt(tmp_path, data))
    with pytest.raises(DatasetError, match="cannot read: No such file"):
        load_sharegpt(tmp_path / "missing.json")


def options(**kw):
    base = dict(profile=None, load_profile=None, loadgen_profile="", endpoint="chat", api_key=None, model=None, prompt_tokens=256,
                output_tokens=0, dataset=None, rate=1.0, max_concurrency=0, max_model_len=0, block_size=16,
                prefix_tokens=1024, turns=4, abort_after_tokens=3, stage_s=10.0, num_steps=4, slo_ttft_ms=0.0,
                slo_tpot_ms=0.0, slo_e2e_ms=0.0, report_dir=".", client_log="", client_log_format="text",
                timeout_s=300.0, seed=0, num_users=8)
    return SimpleNamespace(**{**base, **kw})


def test_options_validate_into_a_config():
    cfg = config_from_options(options(profile="poisson", rate=3.0, slo_ttft_ms=500))
    assert (cfg.profile, cfg.max_concurrency, cfg.slo.ttft_ms, cfg.slo.tpot_ms) == ("poisson", 8, 500, None)
    assert config_from_options(options()).profile == "steady"
    # A worker takes the master's profile; anywhere else a stale forwarded one never wins over the run's own.
    assert config_from_options(options(profile="steady", loadgen_profile="abort"), worker=True).profile == "abort"
    assert config_from_options(options(profile="steady", loadgen_profile="abort")).profile == "steady"
    # The list (--load-profile, the web UI's choice) wins over Locust's free-text --profile.
    assert config_from_options(options(profile="spike", load_profile="ramp")).profile == "ramp"
    assert config_from_options(options(profile="spike", load_profile="")).profile == "spike"
    assert str(config_from_options(options(report_dir="")).report_dir) == "reports"
    with pytest.raises(ConfigError, match="--profile 'burst' is not a load profile"):
        config_from_options(options(profile="burst"))
    with pytest.raises(ConfigError, match="--prompt-tokens must be > 0, got 0"):
        config_from_options(options(prompt_tokens=0))
    with pytest.raises(ConfigError, match="--rate must be > 0"):
        config_from_options(options(profile="poisson", rate=0.0))


def test_shapes_users_over_time():
    kw = dict(num_users=8, spawn_rate=2.0, stage_s=10.0, num_steps=4)
    assert [SteadyShape(**kw).users_at(t) for t in (0, 100)] == [(8, 2.0), (8, 2.0)]
    assert [RampShape(**kw).users_at(t)[0] for t in (0, 15, 29.9, 30, 300)] == [1, 4, 7, 8, 8]
    assert [SpikeShape(**kw).users_at(t)[0] for t in (0, 9.9, 10, 19.9, 20, 35, 45)] == [2, 2, 8, 8, 2, 2, 8]
    assert [StepShape(**kw).users_at(t)[0] for t in (0, 10, 20, 30, 99)] == [2, 4, 6, 8, 8]
    assert shape_for("abort") is SteadyShape and shape_for("ramp") is RampShape


def test_poisson_schedule_is_open_loop_at_the_rate():
    now = [100.0]
    schedule = ArrivalSchedule(rate=5.0, rng=random.Random(7), clock=lambda: now[0])
    slots = [schedule.next_slot() for _ in range(2001)]
    assert slots[0] == 100.0
    gaps = [b - a for a, b in zip(slots, slots[1:], strict=False)]
    assert sum(gaps) / len(gaps) == pytest.approx(0.2, rel=0.06)
    assert min(gaps) < 0.01 < 0.6 < max(gaps)  # exponential, not evenly spaced


def test_a_refused_prompt_still_tells_its_token_count():
    from loadgen.server_info import prompt_tokens_from_error

    text = ("requests.exceptions.HTTPError: 400 Client Error: Bad Request for url: http://h/v1/chat/completions "
            "(This model's maximum context length is 512 tokens. However, you requested 540 tokens (524 in the "
            "messages, 16 in the completion). Please reduce the length of the messages or completion.)")
    assert prompt_tokens_from_error(text) == 524
    assert prompt_tokens_from_error("HTTP 503") is None
