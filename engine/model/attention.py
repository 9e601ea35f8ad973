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
class GroupPlan:
    """Sequences attended by one SDPA call: decodes (one query each) or prefills (padded to Q)."""

    token_index: torch.Tensor | None  # [Tg] rows of the group's tokens in T (None: all of T, in order)
    block_tables: torch.Tensor  # [Bg, nb]: trimmed to the blocks the group's longest sequence needs
    key_mask: torch.Tensor  # [Bg, 1, Q, L] bool: query may attend to key (Q = 1 for decodes)
    query_index: torch.Tensor | None  # [Bg * Q] rows of T, padding clamped (None: decode group)
    output_index: torch.Tensor | None  # [Tg] rows of the padded [Bg * Q] output (None: decode group)


class GatherWorkspace:
    """Two reusable flat buffers for the gathered keys and values (CPU only). Every layer gathers
    tensors of the same size; a fresh multi-MB allocation per layer page-faults on every step."""

    def __init__(self) -> None:
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def buffers(self, numel: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        held = self._buffers
        if held is None or held[0].numel() < numel or held[0].dtype != like.dtype or held[0].device != like.device:
            held = (like.new_empty(numel), like.new_empty(numel))
            self._buffers = held
        return held[0][:numel], held[1][:numel]


@dataclass(slots=True)
class PagedPlan:
    groups: list[GroupPlan]
    workspace: GatherWorkspace


def plan_paged(attn: AttentionMetadata, workspace: GatherWorkspace | None = None) -> PagedPlan:
    """Gather indices and causal masks for a batch; built once per forward, used by every layer.

    Decodes and prefills attend in separate calls: padding 32 one-token decodes to the length
    of a 2,000-token prefill chunk would multiply the attention work by 32.
    """
    workspace = workspace or GatherWorkspace()
    if attn.is_decode_only:
        return PagedPlan([_decode_group(attn, None)], workspace)
    qsl = attn.query_start_loc
    q_lens = [qsl[i + 1] - qsl[i] for i in range(len(qsl) - 1)]
    decode_ids = [i for i, n in enumerate(q_lens) if n == 1]
    prefill_ids = [i for i, n in enumerate(q_lens) if n != 1]
    if not decode_ids:
        return PagedPlan([_prefill_group(attn, None, q_lens)], workspace)
    groups = [_decode_group(attn, decode_ids)]
    if prefill_ids:
        groups.append(_prefill_group(attn, prefill_ids, q_lens))
    return PagedPlan(groups, workspace)


def _select(attn: AttentionMetadata, seq_ids: list[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block tables and context lengths of some sequences, tables trimmed on CPU."""
    device = attn.block_tables.device
    tables, context_lens = attn.block_tables, attn.context_lens.to(device)
    if seq_ids is not None:
        index = torch.tensor(seq_ids, device=device)
        tables, context_lens = tables.index_select(0, index), context_lens.index_select(0, index)
    if device.type == "cpu":  # the gather cost scales with the table width; the max is free on CPU
        longest = int(context_lens.max())
        tables = tables[:, : max(1, -(-longest // attn.block_size))]
    return tables, context_lens


def _decode_group(attn: AttentionMetadata, seq_ids: list[int] | None) -> GroupPlan:
    tables, context_lens = _select(attn, seq_ids)
    key_pos = torch.arange(tables.shape[1] * attn.block_size, device=tables.device)  # [L]
    key_mask = key_pos[None, :] < context_lens[:, None]  # [Bg, L]
    token_index = None
    if seq_ids is not None:
        token_index = torch.tensor([attn.query_start_loc[i] for i in seq_ids], device=tables.device)
    return GroupPlan(token_index, tables, key_mask[:, None, None, :], None, None)


def _prefill_group(attn: AttentionMetadata, seq_ids: list[int] | None, q_lens: list[int]) -> GroupPlan:
    tables, context_lens = _select(attn, seq_ids)
    device, qsl = tables.device, attn.query_start_loc
    ids = list(range(len(q_lens))) if seq_ids is None else seq_ids
    lens_list = [q_lens[i] for i in ids]
    num_group_tokens, max_q = sum(lens_list), max(lens_list)
    starts = torch.tensor([qsl[i] for i in ids], device=device)  # [Bg]
    lens = torch.tensor(lens_list, device=device)  # [Bg]
    offsets = torch.arange(max_q, device=device)  # [Q]
    query_index = (starts[:, None] + offsets[None, :]).clamp(max=qsl[-1] - 1)  # [Bg, Q]
    seq_of_token = torch.repeat_interleave(
        torch.arange(len(ids), device=device), lens, output_size=num_group_tokens
    )  # [Tg]
    group_starts = torch.cumsum(lens, 0) - lens  # [Bg]: where each sequence starts within the group
    j = torch.arange(num_group_tokens, device=device) - group_starts[seq_of_token]  # [Tg]
    output_index = seq_of_token * max_q + j  # [Tg]
    token_index = None if seq_ids is None else starts[seq_of_token] + j  # [Tg]
    # Query j of a sequence sits at position context_len - q_len + j: the new tokens come last.
    key_pos = torch.arange(tables.shape[1] * attn.block_size, device=device)  # [L]
    query_pos = context_lens[:, None] - lens[:, None] + offsets[None, :]  # [Bg, Q]
    causal = key_pos[None, None, :] <= query_pos[:, :, None]  # [Bg, Q, L]
    in_context = key_pos[None, None, :] < context_lens[:, None, None]  # [Bg, 1, L]
    key_mask = (causal & in_context)[:, None]  # [Bg, 1, Q, L]
    return GroupPlan(token_index, tables, key_mask, query_index.flatten(), output_index)


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> None:
    """Store new keys/values [T, Hkv, D] at flat slots of caches [num_blocks, block_size, Hkv, D]."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Read each sequence's blocks in table order: [B, nb] -> [B, Hkv, nb * block_size, D]."""
    num_seqs, num_blocks = block_tables.shape
    total_blocks, block_size, num_kv_heads, head_dim = cache.shape
    # One row per block: index_select of whole rows is several times faster than cache[tables].
    rows = cache.view(total_blocks, -1)  # [num_blocks, bs * Hkv * D]
    if out is not None:
        out = out.view(num_seqs * num_blocks, rows.shape[1])
    gathered = torch.index_select(rows, 0, block_tables.reshape(-1), out=out)  # [B * nb, bs * Hkv * D]
    gathered = gathered.view(num_seqs, num_blocks * block_size, num_kv_heads, head_dim)  # [B, L, Hkv, D]
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
    groups = plan.groups
    if len(groups) == 1 and groups[0].token_index is None:
        return _attend(q, k_cache, v_cache, groups[0], plan.workspace)
    out = torch.empty_like(q)
    for group in groups:
        out.index_copy_(0, group.token_index, _attend(q, k_cache, v_cache, group, plan.workspace))
    return out


def _attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: GroupPlan, workspace: GatherWorkspace
) -> torch.Tensor:
    """One SDPA call over a group's sequences; returns [Tg, H, D] in the group's token order."""
    k_buf = v_buf = None
    if k_cache.device.type == "cpu":  # CUDA's caching allocator already reuses memory
        k_buf, v_buf = workspace.buffers(group.block_tables.numel() * k_cache[0].numel(), k_cache)
    keys = gather_kv(k_cache, group.block_tables, k_buf)  # [Bg, Hkv, L, D]
    values = gather_kv(v_cache, group.block_tables, v_buf)  # [Bg, Hkv, L, D]
    num_seqs, num_heads, head_dim = keys.shape[0], q.shape[1], q.shape[2]
    gqa = num_heads != keys.shape[1]
    if group.query_index is None:  # decodes: one query per sequence
        queries = q if group.token_index is None else q.index_select(0, group.token_index)  # [Bg, H, D]
        out = F.scaled_dot_product_attention(
            queries[:, :, None, :], keys, values, attn_mask=group.key_mask, enable_gqa=gqa
        )  # [Bg, H, 1, D]
        return out[:, :, 0, :]  # [Bg, H, D]
    queries = q.index_select(0, group.query_index).view(num_seqs, -1, num_heads, head_dim)  # [Bg, Q, H, D]
    out = F.scaled_dot_product_attention(
        queries.transpose(1, 2), keys, values, attn_mask=group.key_mask, enable_gqa=gqa
    )  # [Bg, H, Q, D]
    out = out.transpose(1, 2).reshape(-1, num_heads, head_dim)  # [Bg * Q, H, D]
    return out.index_select(0, group.output_index)  # [Tg, H, D]
