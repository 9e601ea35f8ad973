"""Fixtures for the engine core tests: a tiny seeded Llama built in milliseconds."""

import dataclasses

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.engine import LLMEngine
from engine.model.builtin import BUILTIN_CONFIG, build_builtin, builtin_tokenizer
from engine.model.loader import LoadedModel

TINY_CONFIG = dataclasses.replace(
    BUILTIN_CONFIG,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
)


def tiny_loaded(dtype: torch.dtype = torch.float64) -> LoadedModel:
    model = build_builtin(dtype, torch.device("cpu"), TINY_CONFIG)
    weights_bytes = TINY_CONFIG.num_params() * dtype.itemsize
    return LoadedModel(model, TINY_CONFIG, builtin_tokenizer(), "tiny", "tiny-digest", weights_bytes)


@pytest.fixture(autouse=True)
def single_thread():
    """The tiny model's matmuls are far too small for two threads: on a busy machine the thread
    hand-off costs 10x the work. Restored after each test so other packages' tests see no change."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def loaded() -> LoadedModel:
    return tiny_loaded()


@pytest.fixture
def make_engine(loaded):
    """make_engine(**EngineConfig fields) -> LLMEngine over the shared tiny float64 model."""

    def make(clock=None, **overrides) -> LLMEngine:
        config = EngineConfig(**{"num_kv_blocks": 64, "block_size": 4, "max_model_len": 32, **overrides})
        if clock is None:
            return LLMEngine(config, loaded=loaded)
        return LLMEngine(config, clock, loaded=loaded)

    return make


def run_to_completion(engine: LLMEngine, max_steps: int = 10_000) -> dict[str, list]:
    """Step until idle; request_id -> [token ids, text, final output]."""
    results: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return results
        for out in engine.step().outputs:
            entry = results.setdefault(out.request_id, [[], "", None])
            entry[0].extend(out.new_token_ids)
            entry[1] += out.new_text
            if out.finished:
                entry[2] = out
    raise AssertionError("engine did not finish")
