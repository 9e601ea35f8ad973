"""Paged KV cache bookkeeping: blocks, the free-block queue, the block pool and the KV cache manager.

Layering (as in vLLM v1), one responsibility each:

    KVCacheBlock    one block id, its reference count and (when full and cached) its hash
    FreeBlockQueue  blocks with ref_cnt 0, in eviction order (LRU head, most recent tail)
    BlockPool       all blocks + the hash -> block map of cached full blocks
    KVCacheManager  which blocks each request holds; prefix lookup; check/act allocation

A request's tokens map onto its blocks like this (block_size 4, 10 tokens computed):

    tokens   | t0 t1 t2 t3 | t4 t5 t6 t7 | t8 t9 .  . |
    blocks   |  block 7    |  block 2    |  block 5   |
    hashes   |  h0=H(-,t0..t3) h1=H(h0,t4..t7)  (none: not full)

Only full blocks are hashed, each from its parent's hash and its own token ids, so one differing
token invalidates that block and every block after it.
"""

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from engine.core.sequence import Request

NONE_HASH = b"\x00" * 16


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None  # set while the block holds a cached full block


def hash_block_tokens(parent_hash: bytes | None, token_ids: list[int]) -> bytes:
    """Chained hash of one full block: H(parent hash, token ids)."""
    data = (parent_hash or NONE_HASH) + b"".join(t.to_bytes(4, "little", signed=True) for t in token_ids)
    return hashlib.sha256(data).digest()[:16]


class FreeBlockQueue:
    """Free blocks in eviction order: allocation pops the head (least recently freed)."""

    def __init__(self, blocks: list[KVCacheBlock]):
        self._blocks: OrderedDict[int, KVCacheBlock] = OrderedDict((b.block_id, b) for b in blocks)

    def __len__(self) -> int:
        return len(self._blocks)

    def popleft(self) -> KVCacheBlock:
        return self._blocks.popitem(last=False)[1]

    def remove(self, block: KVCacheBlock) -> None:
        del self._blocks[block.block_id]

    def append(self, block: KVCacheBlock) -> None:
        self._blocks[block.block_id] = block

    def block_ids(self) -> list[int]:
        return list(self._blocks)


class BlockPool:
    """All KV blocks, the free queue and the map of cached full blocks."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.hash_to_block: dict[bytes, KVCacheBlock] = {}
        self.num_cached_free = 0  # free blocks that still hold a cached prefix

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        return self.hash_to_block.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop blocks from the free queue head; a popped block's cached prefix is evicted."""
        if num_blocks > len(self.free_queue):
            raise RuntimeError(f"asked for {num_blocks} blocks, {len(self.free_queue)} free")
        new_blocks = []
        for _ in range(num_blocks):
            block = self.free_queue.popleft()
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            new_blocks.append(block)
        return new_blocks

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits; a free hit leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
                self.num_cached_free -= 1
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: list[KVCacheBlock]) -> None:
        """Drop one reference each; blocks reaching 0 join the free queue tail in this order."""
        for block in ordered_blocks:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block.block_id} freed twice"
            if block.ref_cnt == 0:
                self.free_queue.append(block)
                if block.block_hash is not None:
                    self.num_cached_free += 1

    def cache_block(self, block: KVCacheBlock, block_hash: bytes) -> None:
        """Register a full block under its hash (first writer wins on a duplicate)."""
        if block.block_hash is not None or block_hash in self.hash_to_block:
            return
        block.block_hash = block_hash
        self.hash_to_block[block_hash] = block

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix held by a free block (used after a failed step)."""
        for block_id in self.free_queue.block_ids():
            block = self.blocks[block_id]
            if block.block_hash is not None:
                del self.hash_to_block[block.block_hash]
                block.block_hash = None
        self.num_cached_free = 0

    def _evict(self, block: KVCacheBlock) -> None:
        del self.hash_to_block[block.block_hash]
        block.block_hash = None
        self.num_cached_free -= 1


class KVCacheManager:
    """Which blocks each request holds, prefix lookup, and check/act allocation pairs."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # leading blocks already registered in the cache

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_blocks - self.pool.num_free_blocks

    @property
    def num_cached_free_blocks(self) -> int:
        return self.pool.num_cached_free

    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest run of cached full blocks at the start of the request's tokens.

        The hit never covers the last token: the model must compute at least one token to
        produce the logits the next token is sampled from, so a fully cached prompt of N full
        blocks hits N-1 blocks and recomputes the whole last block (only full blocks are cached).
        """
        if not self.enable_caching:
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        self._ensure_hashes(request, max_hit_blocks)
        hits = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def num_blocks_needed(self, request: Request, num_new_tokens: int, num_computed_blocks: int = 0) -> int:
        """New blocks for `num_new_tokens` more tokens after the computed ones and the cache hits."""
        num_tokens = request.num_computed_tokens + num_computed_blocks * self.block_size + num_new_tokens
        held = len(self.req_to_blocks.get(request.request_id, ())) + num_computed_blocks
        return max(0, -(-num_tokens // self.block_size) - held)

    def can_allocate(
        self, request: Request, num_new_tokens: int, computed_blocks: list[KVCacheBlock] | None = None
    ) -> bool:
        computed_blocks = computed_blocks or []
        # A free cache hit leaves the free queue when touched, so it counts against the free blocks.
        num_free_hits = sum(1 for b in computed_blocks if b.ref_cnt == 0)
        needed = self.num_blocks_needed(request, num_new_tokens, len(computed_blocks))
        return needed + num_free_hits <= self.pool.num_free_blocks

    def allocate(
        self, request: Request, num_new_tokens: int, computed_blocks: list[KVCacheBlock] | None = None
    ) -> None:
        """Give the request blocks for `num_new_tokens` more tokens (call can_allocate first).

        `computed_blocks` are prefix-cache hits from get_computed_blocks: they are taken by
        reference and their tokens added to `request.num_computed_tokens`.
        """
        num_computed_blocks = len(computed_blocks) if computed_blocks else 0
        needed = self.num_blocks_needed(request, num_new_tokens, num_computed_blocks)
        blocks = self.req_to_blocks.get(request.request_id)
        if blocks is None:
            blocks = self.req_to_blocks[request.request_id] = []
        if computed_blocks:
            self.pool.touch(computed_blocks)
            blocks.extend(computed_blocks)
            request.num_computed_tokens += num_computed_blocks * self.block_size
        if needed:
            blocks.extend(self.pool.get_new_blocks(needed))
        if self.enable_caching:
            self._cache_full_blocks(request, request.num_computed_tokens + num_new_tokens)

    def free(self, request: Request) -> None:
        """Release the request's blocks at once; tail blocks first so they are evicted first."""
        blocks = self.req_to_blocks.pop(request.request_id, None)
        self.num_cached_blocks.pop(request.request_id, None)
        if blocks:
            self.pool.free_blocks(list(reversed(blocks)))

    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        # The tokens of this step are known before their K/V is written; blocks registered now
        # are read by other sequences only through the same forward, which writes every new
        # K/V of a layer before any query of that layer attends.
        num_full = num_tokens // self.block_size
        start = self.num_cached_blocks.get(request.request_id, 0)
        if num_full <= start:
            return
        self._ensure_hashes(request, num_full)
        blocks = self.req_to_blocks[request.request_id]
        for i in range(start, num_full):
            self.pool.cache_block(blocks[i], request.block_hashes[i])
        self.num_cached_blocks[request.request_id] = num_full

    def _ensure_hashes(self, request: Request, num_blocks: int) -> None:
        hashes = request.block_hashes
        size = self.block_size
        tokens = request.all_token_ids
        while len(hashes) < num_blocks:
            i = len(hashes)
            hashes.append(hash_block_tokens(hashes[-1] if hashes else None, tokens[i * size : (i + 1) * size]))
