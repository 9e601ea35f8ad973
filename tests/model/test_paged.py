"""Decoding through the paged KV cache equals a full recompute without any cache."""

import random
from dataclasses import dataclass, field

import pytest
import torch

from engine.model.attention import AttentionMetadata
from engine.model.llama import CausalLM
from tests.model.conftest import load

BLOCK_SIZE = 4
NUM_BLOCKS = 48


@dataclass
class Seq:
    token_ids: list[int]
    block_ids: list[int]
    num_computed: int = 0  # tokens whose K/V are in the cache
    logits: list[torch.Tensor] = field(default_factory=list)  # one row per step it took part in
    logit_positions: list[int] = field(default_factory=list)  # position each row was computed at


class PagedHarness:
    """Just enough of a block manager: shuffled, non-contiguous block ids per sequence."""

    def __init__(self, model: CausalLM, seed: int = 0):
        cfg = model.config
        shape = (NUM_BLOCKS, BLOCK_SIZE, cfg.num_key_value_heads, cfg.head_dim)
        self.model = model
        self.kv_caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_hidden_layers)]
        weight = next(model.parameters())
        self.device = weight.device
        self.kv_caches = [(k.to(weight), v.to(weight)) for k, v in self.kv_caches]  # model device, dtype
        self.free = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(self.free)

    def new_seq(self, token_ids: list[int], shared_blocks: list[int] | None = None, num_cached: int = 0) -> Seq:
        return Seq(list(token_ids), list(shared_blocks or []), num_computed=num_cached)

    def step(self, batch: list[tuple[Seq, int]], pad_blocks: int = 0) -> torch.Tensor:
        """Run n new tokens for each (seq, n); returns logits [num_seqs, vocab]."""
        input_ids, positions, slots, qsl, context_lens = [], [], [], [0], []
        for seq, n in batch:
            end = seq.num_computed + n
            while len(seq.block_ids) * BLOCK_SIZE < end:
                seq.block_ids.append(self.free.pop())
            for pos in range(seq.num_computed, end):
                input_ids.append(seq.token_ids[pos])
                positions.append(pos)
                slots.append(seq.block_ids[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
            qsl.append(qsl[-1] + n)
            context_lens.append(end)
            seq.num_computed = end
        width = max(len(seq.block_ids) for seq, _ in batch) + pad_blocks
        tables = [seq.block_ids + [0] * (width - len(seq.block_ids)) for seq, _ in batch]
        dev = self.device
        attn = AttentionMetadata(
            slot_mapping=torch.tensor(slots, device=dev), query_start_loc=qsl,
            context_lens=torch.tensor(context_lens, device=dev), block_tables=torch.tensor(tables, device=dev),
            block_size=BLOCK_SIZE, is_decode_only=all(n == 1 for _, n in batch),
        )
        ids, pos = torch.tensor(input_ids, device=dev), torch.tensor(positions, device=dev)
        logits = self.model.forward(ids, pos, self.kv_caches, attn).cpu()
        for (seq, _), row in zip(batch, logits, strict=True):
            seq.logits.append(row)
            seq.logit_positions.append(seq.num_computed - 1)
        return logits


def full_last_logits(model: CausalLM, token_ids: list[int]) -> torch.Tensor:
    device = next(model.parameters()).device
    return model.forward_full(torch.tensor([token_ids], device=device))[0, -1].cpu()


def assert_matches_full_recompute(model: CausalLM, seq: Seq, num_prompt: int) -> None:
    """Every paged step's logits equal a cache-free forward at the same position, and each
    generated token is the greedy choice of that full recompute."""
    device = next(model.parameters()).device
    full = model.forward_full(torch.tensor([seq.token_ids], device=device))[0].cpu()  # [S, vocab]
    torch.testing.assert_close(torch.stack(seq.logits), full[seq.logit_positions], atol=1e-4, rtol=0)
    generated = seq.token_ids[num_prompt:]
    assert generated == full[num_prompt - 1 : len(seq.token_ids) - 1].argmax(-1).tolist()


def test_chunked_prefill_then_batched_decode_matches_full_recompute(llama_ckpt):
    model = load(llama_ckpt[0]).model
    harness = PagedHarness(model, seed=3)
    prompts = [list(range(10, 27)), [5, 9, 200, 7, 7, 1, 299], list(range(100, 110))]
    seqs = [harness.new_seq(p) for p in prompts]
    a, b, c = seqs
    harness.step([(a, 6), (b, 7), (c, 3)])  # b's whole prompt; a and c: first chunk
    harness.step([(a, 11), (c, 7)])  # second chunks
    num_decode = 8
    for i in range(num_decode):
        for seq in seqs:
            seq.token_ids.append(int(seq.logits[-1].argmax()))
        if i < num_decode - 1:
            harness.step([(seq, 1) for seq in seqs], pad_blocks=i % 3)  # tables wider than needed
    for seq, prompt in zip(seqs, prompts, strict=True):
        assert len(seq.token_ids) == len(prompt) + num_decode
        assert_matches_full_recompute(model, seq, len(prompt))
        blocks = seq.block_ids
        assert blocks != list(range(blocks[0], blocks[0] + len(blocks)))  # really non-contiguous
    assert a.logit_positions == [5, 16, *range(17, 24)]


def test_mixed_prefill_and_decode_batch(llama_ckpt):
    """Decodes and prefill chunks interleaved in one batch: each attends in its own group."""
    model = load(llama_ckpt[0]).model
    harness = PagedHarness(model, seed=5)
    a = harness.new_seq([3, 1, 4, 1, 5, 9, 2, 6])
    c = harness.new_seq(list(range(200, 221)))
    b = harness.new_seq(list(range(40, 53)))
    d = harness.new_seq(list(range(150, 160)))
    harness.step([(a, 8), (c, 21)])
    for seq in (a, c):
        seq.token_ids.append(int(seq.logits[-1].argmax()))
    harness.step([(b, 13), (a, 1), (d, 4), (c, 1)])  # prefill, decode, prefill chunk, decode
    harness.step([(d, 6)])
    for seq, num_prompt in ((a, 8), (b, 13), (c, 21), (d, 10)):
        seq.token_ids.append(int(seq.logits[-1].argmax()))
        assert_matches_full_recompute(model, seq, num_prompt)
    assert d.logit_positions == [3, 9]


def test_cached_prefix_is_read_not_recomputed(llama_ckpt):
    model = load(llama_ckpt[0]).model
    harness = PagedHarness(model, seed=7)
    shared = list(range(60, 72))  # three full blocks
    a = harness.new_seq(shared + [1, 2, 3])
    harness.step([(a, len(a.token_ids))])
    # b reuses a's first three blocks: only its own tail goes through the model.
    b = harness.new_seq(shared + [250, 251, 252, 253, 254], shared_blocks=a.block_ids[:3], num_cached=12)
    logits = harness.step([(b, 5)])
    torch.testing.assert_close(logits[0], full_last_logits(model, b.token_ids), atol=1e-4, rtol=0)
    # Corrupting the shared blocks changes b's result: the prefix really is read from the cache.
    for k_cache, _ in harness.kv_caches:
        k_cache[a.block_ids[:3]] = 0
    c = harness.new_seq(b.token_ids, shared_blocks=a.block_ids[:3], num_cached=12)
    corrupted = harness.step([(c, 5)])
    assert (corrupted[0] - logits[0]).abs().max() > 1e-2


def test_builtin_paged_decode_matches_full(builtin):
    model = builtin.model
    harness = PagedHarness(model, seed=11)
    prompt = builtin.tokenizer.encode(builtin.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]))
    seq = harness.new_seq(prompt)
    harness.step([(seq, len(prompt))])
    for _ in range(4):
        seq.token_ids.append(int(seq.logits[-1].argmax()))
        harness.step([(seq, 1)])
    seq.token_ids.append(int(seq.logits[-1].argmax()))
    assert_matches_full_recompute(model, seq, len(prompt))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_paged_decode_tracks_full(llama_ckpt, dtype):
    model = load(llama_ckpt[0], dtype=dtype).model
    harness = PagedHarness(model, seed=13)
    assert harness.kv_caches[0][0].dtype == getattr(torch, dtype)
    seq = harness.new_seq(list(range(70, 93)))
    harness.step([(seq, 9)])
    harness.step([(seq, 14)])
    for _ in range(3):
        seq.token_ids.append(int(seq.logits[-1].argmax()))
        harness.step([(seq, 1)])
    full = model.forward_full(torch.tensor([seq.token_ids]))[0].float()  # [S, vocab]
    paged = torch.stack(seq.logits).float()
    assert (paged - full[seq.logit_positions]).abs().max() < 0.05 * full.abs().max()
