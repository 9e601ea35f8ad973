"""Block manager: exact block ids, reference counts, LRU eviction order, chained prefix hashes."""

from engine.core.block_manager import KVCacheManager, hash_block_tokens
from engine.core.sampling import SamplingParams
from engine.core.sequence import Request


def make_request(request_id: str, tokens: list[int]) -> Request:
    return Request(request_id, tokens, SamplingParams(), arrival_ts=0.0)


def admit(kv: KVCacheManager, request: Request) -> int:
    """What the scheduler does for a waiting request: prefix lookup, then check/act allocation."""
    blocks, num_hit = kv.get_computed_blocks(request)
    num_new = request.num_tokens - num_hit
    assert kv.can_allocate(request, num_new, blocks)
    kv.allocate(request, num_new, blocks)
    request.num_computed_tokens += num_new
    return num_hit


def test_allocation_takes_blocks_in_order_and_free_returns_them():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = make_request("a", list(range(10)))  # 3 blocks: 4 + 4 + 2
    admit(kv, a)
    assert kv.block_ids("a") == [0, 1, 2]
    assert kv.num_used_blocks == 3 and kv.num_free_blocks == 5
    assert [kv.pool.blocks[i].ref_cnt for i in range(3)] == [1, 1, 1]
    kv.free(a)
    assert kv.num_used_blocks == 0
    # Freed in reverse: the tail block is the first to be reused after the never-used ones.
    assert kv.pool.free_queue.block_ids() == [3, 4, 5, 6, 7, 2, 1, 0]
    # Two full blocks stay cached after the free; the partial third block never was.
    assert kv.num_cached_free_blocks == 2


def test_shared_prefix_shares_blocks_by_reference_count():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    prompt = list(range(12))
    a, b = make_request("a", prompt + [50]), make_request("b", prompt + [60, 61])
    assert admit(kv, a) == 0
    assert admit(kv, b) == 12
    assert kv.block_ids("a") == [0, 1, 2, 3]
    assert kv.block_ids("b") == [0, 1, 2, 4]
    assert [kv.pool.blocks[i].ref_cnt for i in range(5)] == [2, 2, 2, 1, 1]
    kv.free(a)
    assert [kv.pool.blocks[i].ref_cnt for i in range(5)] == [1, 1, 1, 0, 1]
    assert kv.num_used_blocks == 4


def test_last_prompt_token_is_always_computed():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    prompt = list(range(8))  # exactly two full blocks
    admit(kv, make_request("a", prompt))
    kv.free(make_request("x", [5]))  # freeing a request that holds nothing is a no-op
    assert kv.num_used_blocks == 2
    # The same prompt again hits only the first block: the second must be recomputed for logits.
    assert admit(kv, make_request("b", prompt)) == 4


def test_one_differing_first_token_misses_every_block():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    prompt = list(range(20))
    admit(kv, make_request("a", prompt))
    assert admit(kv, make_request("b", [99] + prompt[1:])) == 0
    assert admit(kv, make_request("c", prompt[:-1] + [98])) == 16
    assert hash_block_tokens(None, [1, 2]) != hash_block_tokens(hash_block_tokens(None, [0]), [1, 2])


def test_cached_free_blocks_are_evicted_lru_only_when_needed():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = make_request("a", list(range(9)))  # blocks 0,1 full + 2 partial
    admit(kv, a)
    kv.free(a)
    assert kv.pool.free_queue.block_ids() == [3, 4, 5, 6, 7, 2, 1, 0]
    b = make_request("b", [200 + i for i in range(16)])  # 4 blocks from the head: never-used first
    admit(kv, b)
    assert kv.block_ids("b") == [3, 4, 5, 6]
    assert kv.num_cached_free_blocks == 2  # blocks 0 and 1 still hold a's prefix
    c = make_request("c", list(range(9)))
    assert admit(kv, c) == 8  # a's prefix is still there
    assert kv.block_ids("c") == [0, 1, 7]
    kv.free(b)  # tail first: 6, 5, 4, 3 join the queue behind 2
    assert kv.pool.free_queue.block_ids() == [2, 6, 5, 4, 3]
    assert kv.num_cached_free_blocks == 4
    d = make_request("d", [300 + i for i in range(17)])  # 5 blocks: evicts b's cached blocks LRU
    assert admit(kv, d) == 0
    assert kv.block_ids("d") == [2, 6, 5, 4, 3]
    assert kv.num_cached_free_blocks == 0
    assert not kv.can_allocate(make_request("f", [1]), 1)


def test_can_allocate_counts_free_cache_hits_against_free_blocks():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    a = make_request("a", list(range(9)))
    admit(kv, a)
    kv.free(a)
    b = make_request("b", list(range(8)) + [7] * 8)  # hits 2 free cached blocks, needs 2 more
    blocks, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 8
    assert kv.can_allocate(b, 8, blocks)
    assert not kv.can_allocate(b, 12, blocks)  # 3 new + 2 hits > 4 free


def test_prefix_caching_off_never_hits_and_keeps_no_hashes():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_caching=False)
    a = make_request("a", list(range(9)))
    admit(kv, a)
    kv.free(a)
    assert kv.num_cached_free_blocks == 0
    assert admit(kv, make_request("b", list(range(9)))) == 0
    assert kv.pool.hash_to_block == {}
