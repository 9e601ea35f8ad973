"""The CUDA path: same greedy tokens as on CPU, and a KV budget from gpu_memory_utilization."""

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.engine import LLMEngine
from engine.core.sampling import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PROMPTS = [[(7 * i + 3 * j) % 250 for j in range(40)] for i in range(4)]


def greedy(engine: LLMEngine) -> dict[str, list[int]]:
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step().outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def test_cuda_greedy_tokens_match_cpu():
    cpu = greedy(LLMEngine(EngineConfig(num_kv_blocks=64, max_model_len=256)))
    cuda = greedy(LLMEngine(EngineConfig(device="cuda", num_kv_blocks=64, max_model_len=256)))
    assert cuda == cpu


def test_gpu_memory_utilization_budget_leaves_room_for_weights_and_activations():
    engine = LLMEngine(EngineConfig(device="cuda", gpu_memory_utilization=0.05, max_model_len=1024))
    report = engine.capacity
    total = torch.cuda.get_device_properties(engine.runner.device).total_memory
    assert 0 < report.kv_cache_bytes <= total * 0.05 - report.weights_bytes
    assert report.num_blocks * report.block_size * report.kv_bytes_per_token == report.kv_cache_bytes


def test_cuda_penalties_bias_and_logprobs_match_cpu():
    """The logits processors and logprobs on CUDA tensors: the same changes as on CPU (float32 logits)."""
    from engine.core.sampler import Sampler
    from engine.core.sequence import Request

    params = [SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=1.0, logprobs=3),
              SamplingParams(temperature=0.0, repetition_penalty=1.5, logit_bias={7: 2.0}, min_tokens=3,
                             stop_token_ids=[9], logprobs=0)]
    requests = []
    for i, p in enumerate(params):
        request = Request(f"r{i}", [1, 2, 3, 7], p, 0.0)
        for token in (3, 3, 9, 11) if i == 0 else ():  # the second has generated nothing: min_tokens bites
            request.append_token(token)
        requests.append(request)
    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(0))
    results = {}
    for device in ("cpu", "cuda"):
        sampler = Sampler(torch.device(device), seed=0, eos_token_id=5)
        processed = sampler.process(logits.to(device), requests)
        tokens = sampler.choose(processed, requests)
        results[device] = (processed.cpu(), tokens, sampler.logprobs(processed, requests, tokens))
    assert torch.allclose(results["cpu"][0], results["cuda"][0], atol=1e-5, equal_nan=True)
    assert results["cpu"][1] == results["cuda"][1]
    for a, b in zip(results["cpu"][2], results["cuda"][2], strict=True):
        assert a.token_id == b.token_id and [t for t, _ in a.top] == [t for t, _ in b.top]
        assert abs(a.logprob - b.logprob) < 1e-4
