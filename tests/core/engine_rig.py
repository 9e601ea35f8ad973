"""Helpers for the engine core tests: a tiny seeded Llama built in milliseconds, a run-to-end loop."""

import dataclasses

import torch

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
    """float64 by default: batch-composition rounding then never flips a greedy argmax."""
    model = build_builtin(dtype, torch.device("cpu"), TINY_CONFIG)
    weights_bytes = TINY_CONFIG.num_params() * dtype.itemsize
    return LoadedModel(model, TINY_CONFIG, builtin_tokenizer(), "tiny", "tiny-digest", weights_bytes)


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
