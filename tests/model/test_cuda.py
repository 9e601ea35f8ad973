"""The CUDA path: same logits as the CPU, paged decode on the GPU, the device memory budget."""

import pytest
import torch

from engine.core.config import EngineConfig
from engine.errors import OutOfMemoryError
from engine.model.loader import load_model
from tests.model.test_paged import PagedHarness, assert_matches_full_recompute

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_builtin_on_cuda_matches_cpu(builtin):
    gpu = load_model(EngineConfig(device="cuda"))
    assert gpu.digest == builtin.digest
    ids = torch.tensor([builtin.tokenizer.encode("same weights on every device")])
    cpu_logits = builtin.model.forward_full(ids)
    gpu_logits = gpu.model.forward_full(ids.cuda()).cpu()
    torch.testing.assert_close(gpu_logits, cpu_logits, atol=2e-3, rtol=0)


def test_paged_decode_on_cuda_matches_full(llama_ckpt):
    model = load_model(EngineConfig(model=str(llama_ckpt[0]), device="cuda")).model
    harness = PagedHarness(model, seed=2)
    prompt = list(range(30, 49))
    seq = harness.new_seq(prompt)
    harness.step([(seq, 11)])
    harness.step([(seq, 8)])
    for _ in range(3):
        seq.token_ids.append(int(seq.logits[-1].argmax()))
        harness.step([(seq, 1)], pad_blocks=2)
    seq.token_ids.append(int(seq.logits[-1].argmax()))
    assert_matches_full_recompute(model, seq, len(prompt))


def test_weights_over_gpu_budget():
    with pytest.raises(OutOfMemoryError, match=r"device memory x gpu_memory_utilization 1e-05"):
        load_model(EngineConfig(device="cuda", gpu_memory_utilization=1e-5))
