"""Penalties, logit_bias, min_tokens and logprobs: exact arithmetic on logits, then through the real engine."""

import math

import torch
from engine_rig import run_to_completion

from engine.core.outputs import FinishReason
from engine.core.sampler import Sampler
from engine.core.sampling import SamplingParams
from engine.core.sequence import Request

CPU = torch.device("cpu")


def request(params: SamplingParams, prompt: list[int], output: list[int]) -> Request:
    r = Request("r", prompt, params, 0.0)
    for token in output:
        r.append_token(token)
    return r


def test_each_kind_changes_exactly_its_rows_and_tokens():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, 0.0, 3.0]] * 5)
    batch = [
        request(SamplingParams(), [0], [1]),  # untouched
        request(SamplingParams(repetition_penalty=2.0), [0, 1], [5]),  # seen: 0, 1 (prompt), 5 (output)
        request(SamplingParams(frequency_penalty=1.0, presence_penalty=0.5), [0], [2, 2, 3]),  # output only
        request(SamplingParams(logit_bias={4: 10.0, 0: -100.0}), [0], []),
        request(SamplingParams(min_tokens=2, max_tokens=4, stop_token_ids=[3]), [0], [2]),  # eos id 5
    ]
    out = Sampler(CPU, seed=0, eos_token_id=5).process(logits, batch)
    assert out[0].tolist() == [2.0, -2.0, 1.0, 0.5, 0.0, 3.0]
    assert out[1].tolist() == [1.0, -4.0, 1.0, 0.5, 0.0, 1.5]
    assert out[2].tolist() == [2.0, -2.0, 1.0 - 2.0 - 0.5, 0.5 - 1.0 - 0.5, 0.0, 3.0]
    assert out[3].tolist() == [-98.0, -2.0, 1.0, 0.5, 10.0, 3.0]
    assert out[4].tolist() == [2.0, -2.0, 1.0, -math.inf, 0.0, -math.inf]
    assert logits[1].tolist() == [2.0, -2.0, 1.0, 0.5, 0.0, 3.0]  # the caller's logits are left as they were
    done = request(SamplingParams(min_tokens=1, stop_token_ids=[3]), [0], [2])  # min reached: no mask
    assert Sampler(CPU, seed=0, eos_token_id=5).process(logits[:1], [done]).tolist() == [logits[0].tolist()]


def test_logprobs_are_the_processed_distribution_of_the_chosen_token():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    batch = [request(SamplingParams(temperature=0.0, logprobs=2), [0], []),
             request(SamplingParams(temperature=0.0, logit_bias={3: 5.0}, logprobs=0), [0], [])]
    sampler = Sampler(CPU, seed=0)
    processed = sampler.process(logits, batch)
    tokens = sampler.choose(processed, batch)
    first, second = sampler.logprobs(processed, batch, tokens)
    expected = torch.tensor([1.0, 2.0, 3.0, 0.0]).log_softmax(-1).tolist()
    assert tokens == [2, 3]
    assert first.token_id == 2 and math.isclose(first.logprob, expected[2], rel_tol=1e-6)
    assert [i for i, _ in first.top] == [2, 1] and math.isclose(first.top[1][1], expected[1], rel_tol=1e-6)
    assert second.top == [] and math.isclose(second.logprob, math.log(math.exp(5) / (3 + math.exp(5))),
                                             rel_tol=1e-6)
    assert sampler.logprobs(processed, [request(SamplingParams(), [0], [])] * 2, tokens) == [None, None]


def test_bias_and_min_tokens_steer_the_real_model(make_engine):
    engine = make_engine()
    eos = engine.eos_token_id
    prompt = [10, 20, 30, 40, 50]
    engine.add_request("plain", prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    engine.add_request("biased", prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True,
                                                        logit_bias={77: 100.0}))
    engine.add_request("min", prompt, SamplingParams(max_tokens=12, temperature=0.0, min_tokens=4,
                                                     logit_bias={eos: 100.0}))
    results = run_to_completion(engine)
    alone = make_engine()
    alone.add_request("plain", prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert results["plain"][0] == run_to_completion(alone)["plain"][0]  # neighbours' changes stay theirs
    assert results["biased"][0] == [77] * 6
    tokens, _, final = results["min"]
    assert eos not in tokens[:4] and tokens[4] == eos and final.finish_reason is FinishReason.STOP


def test_repetition_and_presence_penalties_change_greedy_choices(make_engine):
    prompt = [10, 20, 30, 40, 50]
    runs = {}
    for name, extra in (("plain", {}), ("repetition", {"repetition_penalty": 50.0}),
                        ("presence", {"presence_penalty": 2.0, "frequency_penalty": 2.0})):
        engine = make_engine()
        engine.add_request(name, prompt, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, **extra))
        runs[name] = run_to_completion(engine)[name][0]
    assert len(set(runs["plain"])) < 10  # the tiny model repeats itself when nothing stops it
    assert len(set(runs["repetition"])) == 10 and not set(runs["repetition"]) & set(prompt)
    assert runs["presence"] != runs["plain"]


def test_logprobs_follow_every_generated_token(make_engine):
    engine = make_engine()
    engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=3))
    engine.add_request("b", [4, 5, 6], SamplingParams(max_tokens=5, temperature=0.8, seed=1, ignore_eos=True,
                                                      logprobs=0))
    seen = {"a": [], "b": []}
    while engine.has_unfinished_requests():
        for out in engine.step().outputs:
            assert len(out.logprobs or []) == len(out.new_token_ids)
            seen[out.request_id] += list(zip(out.new_token_ids, out.logprobs or [], strict=True))
    assert [len(v) for v in seen.values()] == [5, 5]
    for token, lp in seen["a"]:  # greedy: the chosen token is the most likely one
        assert lp.token_id == token and lp.top[0] == (token, lp.logprob) and len(lp.top) == 3
        assert lp.logprob <= 0 and lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]
    assert all(lp.token_id == token and lp.top == [] and lp.logprob <= 0 for token, lp in seen["b"])
