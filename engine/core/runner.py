"""Model runner: owns the paged KV cache tensors, builds attention metadata and runs the forward."""

import torch

from engine.core.block_manager import KVCacheManager
from engine.core.scheduler import ScheduledRequest
from engine.model.attention import AttentionMetadata
from engine.model.llama import CausalLM, ModelConfig


def allocate_kv_caches(
    cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer a (k_cache, v_cache) pair, each [num_blocks, block_size, num_kv_heads, head_dim]."""
    shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(cfg.num_hidden_layers)
    ]


class ModelRunner:
    def __init__(self, model: CausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 kv_manager: KVCacheManager, device: torch.device):
        self.model = model
        self.kv_caches = kv_caches
        self.kv = kv_manager
        self.block_size = kv_manager.block_size
        self.device = device

    def execute(self, batch: list[ScheduledRequest]) -> torch.Tensor:
        """Run one forward over the batch: logits [len(batch), vocab] of each last new token."""
        input_ids, positions, attn = self.prepare(batch)
        with torch.inference_mode():
            return self.model(input_ids, positions, self.kv_caches, attn)

    def prepare(self, batch: list[ScheduledRequest]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Flatten the batch's new tokens; plain lists first, one tensor copy each at the end."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start_loc = [0]
        context_lens: list[int] = []
        tables: list[list[int]] = []
        decode_only = True
        for item in batch:
            start = item.num_computed_tokens
            end = start + item.num_new_tokens
            block_ids = self.kv.block_ids(item.request.request_id)
            if end - start == 1:
                input_ids.append(item.request.all_token_ids[start])
                positions.append(start)
                slots.append(block_ids[start // bs] * bs + start % bs)
            else:
                decode_only = False
                input_ids.extend(item.request.all_token_ids[start:end])
                positions.extend(range(start, end))
                slots.extend(block_ids[p // bs] * bs + p % bs for p in range(start, end))
            query_start_loc.append(len(input_ids))
            context_lens.append(end)
            tables.append(block_ids)
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        device = self.device
        attn = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            query_start_loc=query_start_loc,
            context_lens=torch.tensor(context_lens, dtype=torch.long, device=device),
            block_tables=torch.tensor(padded, dtype=torch.long, device=device),
            block_size=bs,
            is_decode_only=decode_only,
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=device)
        pos = torch.tensor(positions, dtype=torch.long, device=device)
        return ids, pos, attn
