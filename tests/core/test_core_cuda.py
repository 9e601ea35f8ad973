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
