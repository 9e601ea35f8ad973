"""RequestStats maths, unchained prefix fingerprints, and the sampler's top-k / top-p filter."""

import torch

from engine.core.sampler import Sampler
from engine.core.sampling import SamplingParams
from engine.core.sequence import Request
from engine.obs.stats import RequestStats, prefix_fingerprint


def test_request_stats_derived_intervals():
    stats = RequestStats(arrival_ts=10.0, first_scheduled_ts=10.5, first_token_ts=11.0,
                         token_ts=[11.0, 11.25, 11.75], finished_ts=12.0)
    assert (stats.queue_s, stats.ttft_s, stats.prefill_s) == (0.5, 1.0, 0.5)
    assert (stats.decode_s, stats.e2e_s, stats.tpot_s) == (0.75, 2.0, 0.375)
    assert stats.itl_s == [0.25, 0.5]
    empty = RequestStats(arrival_ts=1.0)
    assert (empty.ttft_s, empty.tpot_s, empty.decode_s, empty.itl_s) == (None, None, None, [])


def test_prefix_fingerprint_hashes_each_block_on_its_own():
    a = list(range(40))
    b = a[:4] + [999] + a[5:]  # differs in the second block of 4 only
    fa, fb = prefix_fingerprint(a, 4), prefix_fingerprint(b, 4)
    assert len(fa) == 8 and all(len(h) == 8 and int(h, 16) >= 0 for h in fa)
    assert [x == y for x, y in zip(fa, fb, strict=True)] == [True, False] + [True] * 6
    assert prefix_fingerprint(a[:7], 4) == fa[:1]  # only full blocks


def rows(params: list[SamplingParams]) -> list[Request]:
    return [Request(str(i), [1], p, 0.0) for i, p in enumerate(params)]


def test_top_k_and_top_p_keep_exactly_the_expected_tokens():
    probs = torch.tensor([[0.1, 0.5, 0.15, 0.25]] * 3, dtype=torch.float64)
    requests = rows([SamplingParams(top_k=2), SamplingParams(top_p=0.6), SamplingParams(top_p=0.8)])
    kept, ids = Sampler._filtered_sorted_probs(probs.log(), requests)
    assert ids[0].tolist() == [1, 3, 2, 0]
    assert (kept > 0).tolist() == [[True, True, False, False], [True, True, False, False],
                                   [True, True, True, False]]


def test_greedy_rows_take_the_argmax_in_a_mixed_batch():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    requests = rows([SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=1, seed=3)])
    assert Sampler(torch.device("cpu"), seed=0).sample(logits, requests) == [1, 0]


def test_suppressed_ids_are_never_picked_in_any_mode():
    logits = torch.tensor([[0.0, 9.0, 8.0, 1.0]] * 3)
    requests = rows([SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=1, seed=3),
                     SamplingParams(temperature=1.0, top_p=0.5)])
    sampler = Sampler(torch.device("cpu"), seed=0, suppress_token_ids=[1, 3])
    assert sampler.sample(logits, requests) == [2, 2, 2]  # 1 was everyone's first choice
    flat = rows([SamplingParams(temperature=100.0)])  # near-uniform: only 0 and 2 remain
    assert {sampler.sample(logits[:1], flat)[0] for _ in range(200)} == {0, 2}
    assert logits[0, 1] == 9.0  # the caller's logits are left as they were


def test_bad_sampling_params_name_the_field():
    import pytest

    from engine import errors

    cases = {
        "max_tokens": SamplingParams(max_tokens=0),
        "temperature": SamplingParams(temperature="hot"),
        "top_p": SamplingParams(top_p=float("nan")),
        "top_k": SamplingParams(top_k=True),
        "seed": SamplingParams(seed=1.5),
        "stop": SamplingParams(stop="END"),
        "stop_token_ids": SamplingParams(stop_token_ids=[300]),
        "presence_penalty": SamplingParams(presence_penalty=2.5),
        "frequency_penalty": SamplingParams(frequency_penalty=float("nan")),
        "repetition_penalty": SamplingParams(repetition_penalty=0.0),
        "min_tokens": SamplingParams(max_tokens=4, min_tokens=5),
        "logit_bias": SamplingParams(logit_bias={260: 1.0}),
        "logprobs": SamplingParams(logprobs=21),
    }
    for param, params in cases.items():
        with pytest.raises(errors.InvalidRequestError, match=f"^{param} ") as info:
            params.validate(vocab_size=260)
        assert info.value.param == param
    SamplingParams(temperature=0, top_p=1, stop=["\n"], stop_token_ids=[259], seed=7, presence_penalty=-2,
                   repetition_penalty=1.3, min_tokens=16, logit_bias={259: -100}, logprobs=20).validate(260)
