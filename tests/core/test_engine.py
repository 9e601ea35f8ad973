"""LLMEngine end to end on a tiny float64 model: paging, preemption, prefix caching, abort, stats."""

import pytest
import torch
from engine_rig import run_to_completion

from engine import errors
from engine.core.outputs import FinishReason
from engine.core.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def prompts(n: int, length: int = 13) -> list[list[int]]:
    return [[(7 * i + 3 * j) % 250 for j in range(length)] for i in range(n)]


def generate(engine, token_lists, params=GREEDY) -> dict[str, list[int]]:
    for i, tokens in enumerate(token_lists):
        engine.add_request(f"r{i}", tokens, params)
    return {rid: entry[0] for rid, entry in run_to_completion(engine).items()}


def test_paged_decode_equals_full_recompute_without_cache(make_engine, loaded):
    engine = make_engine()
    prompt = prompts(1, length=11)[0]
    got = generate(engine, [prompt])["r0"]
    tokens = list(prompt)
    for _ in range(GREEDY.max_tokens):
        logits = loaded.model.forward_full(torch.tensor([tokens]))  # [1, S, vocab]
        tokens.append(int(logits[0, -1].argmax()))
    assert got == tokens[len(prompt) :]


def test_preempted_request_output_equals_unpreempted_run(make_engine):
    token_lists = prompts(4)
    reference = generate(make_engine(num_kv_blocks=64), token_lists)
    tight = make_engine(num_kv_blocks=12)  # 4 prompts of 13 tokens need 16 blocks at the end
    for i, tokens in enumerate(token_lists):
        tight.add_request(f"r{i}", tokens, GREEDY)
    num_preemptions = 0
    results: dict[str, list[int]] = {}
    preemption_ts: dict[str, int] = {}
    while tight.has_unfinished_requests():
        step = tight.step()
        num_preemptions += step.stats.num_preemptions
        for out in step.outputs:
            results.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                preemption_ts[out.request_id] = len(out.metrics.preemption_ts)
    assert num_preemptions > 0
    assert sum(preemption_ts.values()) == num_preemptions
    assert results == reference


def test_batched_output_equals_one_at_a_time(make_engine):
    token_lists = prompts(3)
    batched = generate(make_engine(), token_lists)
    single = make_engine()
    for i, tokens in enumerate(token_lists):
        assert generate(single, [tokens])["r0"] == batched[f"r{i}"]
        single = make_engine()


def test_prefix_cache_skips_the_computation_of_hit_tokens(make_engine):
    engine = make_engine(block_size=4)
    shared = prompts(1, length=16)[0]
    generate(engine, [shared + [1, 2, 3]])
    engine.add_request("b", shared + [9, 9], GREEDY)
    step = engine.step()
    assert (step.stats.prefix_queried_tokens, step.stats.prefix_hit_tokens) == (18, 16)
    assert step.stats.num_prompt_tokens_computed == 2
    assert step.outputs[0].num_cached_tokens == 16
    rest = run_to_completion(engine)
    cached_tokens = step.outputs[0].new_token_ids + rest["b"][0]
    uncached = make_engine(block_size=4, enable_prefix_caching=False)
    uncached.add_request("b", shared + [9, 9], GREEDY)
    first = uncached.step()
    assert first.stats.num_prompt_tokens_computed == 18
    assert (first.stats.prefix_queried_tokens, first.stats.prefix_hit_tokens) == (0, 0)
    assert first.outputs[0].new_token_ids + run_to_completion(uncached)["b"][0] == cached_tokens


def test_abort_frees_blocks_at_once_and_reports_abort_next_step(make_engine):
    engine = make_engine()
    engine.add_request("a", prompts(1)[0], GREEDY)
    engine.step()
    assert engine.kv.num_used_blocks == 4  # 14 tokens in blocks of 4
    engine.abort_request("a")
    assert engine.kv.num_used_blocks == 0
    out = engine.step().outputs
    assert [(o.request_id, o.finished, o.finish_reason) for o in out] == [("a", True, FinishReason.ABORT)]
    assert out[0].metrics.finish_reason == "abort"
    assert not engine.has_unfinished_requests()


def test_stats_off_returns_none_and_keeps_no_request_stats(make_engine):
    engine = make_engine(log_stats=False)
    engine.add_request("a", prompts(1)[0], SamplingParams(max_tokens=2, temperature=0.0))
    steps = [engine.step(), engine.step()]
    assert [s.stats for s in steps] == [None, None]
    assert steps[1].outputs[0].finished and steps[1].outputs[0].metrics is None


def test_request_stats_follow_the_injected_clock(make_engine):
    now = [100.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    engine = make_engine(clock=clock)
    engine.add_request("a", prompts(1)[0], SamplingParams(max_tokens=3, temperature=0.0), arrival_ts=50.0)
    final = run_to_completion(engine)["a"][2]
    m = final.metrics
    assert m.arrival_ts == 50.0 and m.num_output_tokens == 3 and m.finish_reason == "length"
    assert m.first_scheduled_ts < m.first_token_ts == m.token_ts[0] < m.token_ts[-1] <= m.finished_ts
    assert m.ttft_s == m.first_token_ts - 50.0
    assert m.tpot_s == (m.token_ts[2] - m.token_ts[0]) / 2
    assert len(m.itl_s) == 2 and len(m.prefix_fingerprint) == 3  # 13 tokens: 3 full blocks of 4


def test_step_stats_count_blocks_and_tokens(make_engine):
    engine = make_engine(block_size=4)
    engine.add_request("a", prompts(1)[0], SamplingParams(max_tokens=2, temperature=0.0))
    first = engine.step().stats
    assert (first.num_running, first.num_waiting, first.batch_size) == (1, 0, 1)
    assert (first.num_prompt_tokens_computed, first.num_generation_tokens) == (13, 1)
    assert (first.num_blocks_used, first.num_blocks_total, first.scheduled_request_ids) == (4, 64, ["a"])
    last = engine.step().stats
    assert (last.num_running, last.num_blocks_used, last.num_blocks_cached) == (0, 0, 3)
    assert (last.num_prompt_tokens_computed, last.num_generation_tokens) == (0, 1)


def test_prompt_too_long_and_bad_params_are_typed_errors(make_engine):
    engine = make_engine(max_model_len=32)
    with pytest.raises(errors.PromptTooLongError, match=r"maximum context length is 32 tokens.*\(30 in"):
        engine.add_request("a", [1] * 30, SamplingParams(max_tokens=3))
    with pytest.raises(errors.InvalidRequestError, match="top_p"):
        engine.add_request("a", [1], SamplingParams(top_p=0.0))
    with pytest.raises(errors.InvalidRequestError, match="vocabulary"):
        engine.add_request("a", [100_000], SamplingParams())
    with pytest.raises(errors.InvalidRequestError, match="empty"):
        engine.add_request("a", [], SamplingParams())
    engine.add_request("a", [1], SamplingParams())
    with pytest.raises(errors.InvalidRequestError, match="already in use"):
        engine.add_request("a", [1], SamplingParams())


def test_seeded_sampling_is_reproducible_and_top_k_1_is_greedy(make_engine):
    seeded = SamplingParams(max_tokens=10, temperature=1.0, seed=42, ignore_eos=True)
    first = generate(make_engine(), prompts(2), seeded)
    assert generate(make_engine(), prompts(2), seeded) == first
    other = generate(make_engine(), prompts(2), SamplingParams(max_tokens=10, seed=43, ignore_eos=True))
    assert other != first
    top1 = SamplingParams(max_tokens=10, temperature=0.9, top_k=1, top_p=0.5, ignore_eos=True)
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    assert generate(make_engine(), prompts(2), top1) == generate(make_engine(), prompts(2), greedy)


def test_chunked_prefill_gives_the_same_tokens_as_one_prefill(make_engine):
    prompt = prompts(1, length=19)[0]
    whole = generate(make_engine(), [prompt])
    engine = make_engine(max_num_batched_tokens=8)
    engine.add_request("r0", prompt, GREEDY)
    computed = []
    tokens = []
    while engine.has_unfinished_requests():
        step = engine.step()
        computed.append(step.stats.num_prompt_tokens_computed)
        tokens += [t for o in step.outputs for t in o.new_token_ids]
    assert computed[:4] == [8, 8, 3, 0]
    assert tokens == whole["r0"]


def test_step_delay_fault_sleeps_inside_every_step(make_engine, monkeypatch):
    from engine.core import faults

    slept = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    engine = make_engine(faults=faults.FaultConfig(step_delay_s=0.25))
    engine.add_request("a", prompts(1)[0], SamplingParams(max_tokens=3, temperature=0.0))
    run_to_completion(engine)
    assert slept == [0.25, 0.25, 0.25]


def test_identical_prompts_in_one_step_share_blocks_written_by_the_same_forward(make_engine):
    prompt = prompts(1)[0]
    alone = generate(make_engine(), [prompt])["r0"]
    engine = make_engine(block_size=4)
    engine.add_request("a", prompt, GREEDY)
    engine.add_request("b", prompt, GREEDY)
    first = engine.step()
    # b reuses a's three full blocks, which a's K/V fills in this very forward.
    assert (first.stats.prefix_hit_tokens, first.stats.num_prompt_tokens_computed) == (12, 13 + 1)
    assert engine.kv.block_ids("a")[:3] == engine.kv.block_ids("b")[:3]
    rest = run_to_completion(engine)
    tokens = {o.request_id: list(o.new_token_ids) for o in first.outputs}
    assert tokens["a"] + rest["a"][0] == alone
    assert tokens["b"] + rest["b"][0] == alone
