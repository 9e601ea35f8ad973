"""Paged attention: write new K/V into block-structured caches, attend through block tables."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class AttentionMetadata:
    """One batch of sequences flattened to T tokens (see docs/CONTRACTS.md section 7)."""

    slot_mapping: torch.Tensor  # [T] long: block_id * block_size + offset of each new token
    query_start_loc: list[int]  # [num_seqs + 1]: sequence i's new tokens are [qsl[i], qsl[i+1])
    context_lens: torch.Tensor  # [num_seqs] long: tokens in the cache after this step's writes
    block_tables: torch.Tensor  # [num_seqs, max_blocks] long, padded with 0
    block_size: int
    is_decode_only: bool  # every sequence has exactly one new token


@dataclass(slots=True)
class PagedPlan:
    """Index tensors shared by every layer of one forward pass, built once by `plan_paged`."""

    block_tables: torch.Tensor  # [B, nb]: only the blocks the longest sequence needs
    key_mask: torch.Tensor  # [B, 1, Q, L] bool: query may attend to key (Q = 1 for decode)
    query_index: torch.Tensor | None  # [B * Q] token index into T, padding clamped (None: decode-only)
    output_index: torch.Tensor | None  # [T] row of each token in the padded [B * Q] output


def plan_paged(attn: AttentionMetadata) -> PagedPlan:
    """Build gather indices and the causal mask for a batch; called once per forward."""
    device = attn.block_tables.device
    context_lens = attn.context_lens.to(device)
    num_blocks = attn.block_tables.shape[1]
    if device.type == "cpu":
        # Trim padding columns: the gather cost scales with the table width (free on CPU, no sync).
        longest = int(context_lens.max()) if context_lens.numel() else 0
        num_blocks = min(num_blocks, max(1, -(-longest // attn.block_size)))
    block_tables = attn.block_tables[:, :num_blocks]
    key_pos = torch.arange(num_blocks * attn.block_size, device=device)  # [L]
    if attn.is_decode_only:
        key_mask = key_pos[None, :] < context_lens[:, None]  # [B, L]
        return PagedPlan(block_tables, key_mask[:, None, None, :], None, None)
    qsl = attn.query_start_loc
    num_seqs, num_tokens = len(qsl) - 1, qsl[-1]
    q_lens_list = [qsl[i + 1] - qsl[i] for i in range(num_seqs)]
    max_q = max(q_lens_list)
    starts = torch.tensor(qsl[:-1], device=device)  # [B]
    q_lens = torch.tensor(q_lens_list, device=device)  # [B]
    offsets = torch.arange(max_q, device=device)  # [Q]
    query_index = (starts[:, None] + offsets[None, :]).clamp(max=num_tokens - 1)  # [B, Q]
    seq_of_token = torch.repeat_interleave(
        torch.arange(num_seqs, device=device), q_lens, output_size=num_tokens
    )  # [T]
    output_index = torch.arange(num_tokens, device=device) - starts[seq_of_token] + seq_of_token * max_q  # [T]
    # Query j of sequence i sits at position context_len - q_len + j: the new tokens come last.
    query_pos = context_lens[:, None] - q_lens[:, None] + offsets[None, :]  # [B, Q]
    causal = key_pos[None, None, :] <= query_pos[:, :, None]  # [B, Q, L]
    in_context = key_pos[None, None, :] < context_lens[:, None, None]  # [B, 1, L]
    key_mask = (causal & in_context)[:, None]  # [B, 1, Q, L]
    # Padding queries past the context see no key; let them see key 0 so softmax stays finite.
    key_mask[:, 0, :, 0] = True
    return PagedPlan(block_tables, key_mask, query_index.flatten(), output_index)


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> None:
    """Store new keys/values [T, Hkv, D] at flat slots of caches [num_blocks, block_size, Hkv, D]."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """Read each sequence's blocks in table order: [B, nb] -> [B, Hkv, nb * block_size, D]."""
    num_seqs, num_blocks = block_tables.shape
    total_blocks, block_size, num_kv_heads, head_dim = cache.shape
    # One row per block: index_select of whole rows is several times faster than cache[tables].
    rows = cache.view(total_blocks, -1).index_select(0, block_tables.reshape(-1))  # [B * nb, bs*Hkv*D]
    gathered = rows.view(num_seqs, num_blocks * block_size, num_kv_heads, head_dim)  # [B, L, Hkv, D]
    return gathered.transpose(1, 2)  # [B, Hkv, L, D]


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    attn: AttentionMetadata,
    plan: PagedPlan,
) -> torch.Tensor:
    """Write k/v [T, Hkv, D] into the cache, then attend q [T, H, D] causally; returns [T, H, D]."""
    k_cache, v_cache = kv_cache
    write_kv(k, v, k_cache, v_cache, attn.slot_mapping)
    keys = gather_kv(k_cache, plan.block_tables)  # [B, Hkv, L, D]
    values = gather_kv(v_cache, plan.block_tables)  # [B, Hkv, L, D]
    gqa = q.shape[1] != keys.shape[1]
    if attn.is_decode_only:
        queries = q[:, :, None, :]  # [B, H, 1, D]
        out = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=plan.key_mask, enable_gqa=gqa
        )  # [B, H, 1, D]
        return out[:, :, 0, :]  # [T = B, H, D]
    num_seqs, num_heads, head_dim = keys.shape[0], q.shape[1], q.shape[2]
    queries = q.index_select(0, plan.query_index).view(num_seqs, -1, num_heads, head_dim)  # [B, Q, H, D]
    out = F.scaled_dot_product_attention(
        queries.transpose(1, 2), keys, values, attn_mask=plan.key_mask, enable_gqa=gqa
    )  # [B, H, Q, D]
    out = out.transpose(1, 2).reshape(-1, num_heads, head_dim)  # [B * Q, H, D]
    return out.index_select(0, plan.output_index)  # [T, H, D], sequences in order
