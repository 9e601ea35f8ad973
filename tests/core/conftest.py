"""Fixtures for the engine core tests (helpers live in engine_rig.py, a module name no other test dir uses)."""

import pytest
import torch
from engine_rig import tiny_loaded

from engine.core.config import EngineConfig
from engine.core.engine import LLMEngine
from engine.model.loader import LoadedModel


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
