"""The prefix cache of PagedKVManager, with 4-token blocks: exact block ids on hits and misses,
hash chains, the at-least-one-token cap, LRU eviction order, revival, shared ref counts, and the
lookup counters."""

from __future__ import annotations

import pytest

from openinfer_core.interfaces.kv import PrefixCacheStats
from openinfer_kvcache import PagedKVManager
from openinfer_kvcache.block_hash import ROOT_PARENT_HASH, hash_block, hash_blocks

B = 4  # block size


def manager(num_blocks: int = 10, enable: bool = True) -> PagedKVManager:
    return PagedKVManager(num_blocks=num_blocks, block_size=B, enable_prefix_caching=enable)


def run(kv: PagedKVManager, rid: str, tokens: list[int]) -> int:
    """Admit `rid`, compute all its tokens, cache its full blocks; returns the hit tokens."""
    hit = kv.computed_tokens(rid, tokens)
    assert kv.allocate(rid, len(tokens))
    kv.cache_blocks(rid, tokens, len(tokens))
    return hit


def test_hash_is_a_stable_chain() -> None:
    # Literal values: the offload tiers key blocks by these across processes and restarts.
    first = hash_block(ROOT_PARENT_HASH, [1, 2, 3, 4])
    assert first == 11529700859966286497
    assert hash_block(first, [5, 6, 7, 8]) == 14538072545575280849
    assert hash_blocks([1, 2, 3, 4, 5, 6, 7, 8, 9], B) == [first, 14538072545575280849]
    assert hash_blocks([1, 2, 3, 4, 5, 6, 7, 8], B, parent_hash=first, start=1) == [
        14538072545575280849]
    # The same tokens under another parent are another block.
    assert hash_block(12345, [1, 2, 3, 4]) != first


def test_computed_full_blocks_get_chained_hashes() -> None:
    kv = manager()
    prompt = list(range(10))
    assert run(kv, "a", prompt) == 0
    assert list(kv.block_ids("a")) == [1, 2, 3]
    h0 = hash_block(ROOT_PARENT_HASH, [0, 1, 2, 3])
    h1 = hash_block(h0, [4, 5, 6, 7])
    assert [kv.pool.block_hash(b) for b in (1, 2, 3)] == [h0, h1, None]  # 3 is partial
    assert (kv.pool.lookup(h0), kv.pool.lookup(h1)) == (1, 2)


def test_hit_shares_blocks_and_new_tokens_get_new_blocks() -> None:
    kv = manager()
    run(kv, "a", list(range(10)))  # [1, 2, 3]
    b_prompt = [*range(8), 50, 51, 52]
    assert kv.computed_tokens("b", b_prompt) == 8
    assert list(kv.block_ids("b")) == [1, 2]
    assert [kv.pool.ref_count(x) for x in (1, 2, 3)] == [2, 2, 1]
    assert kv.allocate("b", len(b_prompt))
    assert list(kv.block_ids("b")) == [1, 2, 4]
    assert kv.num_used_blocks == 4


def test_same_tokens_after_another_prefix_miss() -> None:
    kv = manager()
    run(kv, "a", list(range(10)))
    # Block [4, 5, 6, 7] is cached, but only after [0, 1, 2, 3].
    assert kv.computed_tokens("b", [9, 9, 9, 9, 4, 5, 6, 7, 8]) == 0
    assert list(kv.block_ids("b")) == []


def test_a_changed_token_in_block_2_keeps_blocks_0_and_1() -> None:
    kv = manager()
    run(kv, "a", list(range(14)))  # three full blocks cached: [1, 2, 3], 4 partial
    changed = list(range(14))
    changed[9] = 99
    assert kv.computed_tokens("b", changed) == 8
    assert list(kv.block_ids("b")) == [1, 2]


@pytest.mark.parametrize(("length", "hit", "blocks"), [
    (8, 4, [1]),  # everything cached: the last block is recomputed
    (9, 8, [1, 2]),  # one uncached token is enough
    (4, 0, []),  # a one-block prompt never hits
])
def test_at_least_one_prompt_token_is_recomputed(length: int, hit: int,
                                                 blocks: list[int]) -> None:
    kv = manager()
    run(kv, "a", list(range(12)))  # [1, 2, 3], all full
    assert kv.computed_tokens("b", list(range(length))) == hit
    assert list(kv.block_ids("b")) == blocks


def test_freed_blocks_stay_cached_and_are_evicted_least_recently_freed_first() -> None:
    kv = manager(num_blocks=6)  # 5 usable
    run(kv, "a", list(range(12)))  # [1, 2, 3]
    kv.free("a")  # tail first: 3, 2, 1 join behind the never-used 4, 5
    assert kv.pool.free_queue() == [4, 5, 3, 2, 1]
    assert (kv.num_used_blocks, kv.num_free_blocks, kv.pool.num_cached) == (0, 5, 3)
    # Three new blocks: 4 and 5, then the least recently freed cached block, 3 (a's tail).
    assert kv.allocate("b", 12)
    assert list(kv.block_ids("b")) == [4, 5, 3]
    assert kv.pool.block_hash(3) is None and kv.pool.num_evictions == 1
    assert kv.pool.free_queue() == [2, 1]
    # a's first two blocks still hit (capped below 12 anyway).
    assert kv.computed_tokens("c", list(range(12))) == 8
    assert list(kv.block_ids("c")) == [1, 2]


def test_a_hit_revives_a_free_cached_block() -> None:
    kv = manager(num_blocks=8)  # 7 usable
    run(kv, "a", list(range(12)))  # [1, 2, 3]
    kv.free("a")
    assert kv.pool.free_queue() == [4, 5, 6, 7, 3, 2, 1]
    assert kv.computed_tokens("b", [*range(8), 70]) == 8
    assert list(kv.block_ids("b")) == [1, 2]
    assert [kv.pool.ref_count(x) for x in (1, 2, 3)] == [1, 1, 0]
    assert kv.pool.free_queue() == [4, 5, 6, 7, 3]
    assert (kv.num_used_blocks, kv.num_free_blocks) == (2, 5)
    kv.free("b")  # freed again, now the most recently freed
    assert kv.pool.free_queue() == [4, 5, 6, 7, 3, 2, 1]


def test_two_requests_share_until_both_free() -> None:
    kv = manager()
    run(kv, "a", list(range(9)))  # [1, 2, 3]
    run(kv, "b", [*range(8), 60, 61, 62, 63, 64])  # hits [1, 2], then [4, 5]
    assert list(kv.block_ids("b")) == [1, 2, 4, 5]
    assert [kv.pool.ref_count(x) for x in range(1, 6)] == [2, 2, 1, 1, 1]
    kv.free("a")
    assert [kv.pool.ref_count(x) for x in range(1, 6)] == [1, 1, 0, 1, 1]
    assert kv.pool.free_queue() == [6, 7, 8, 9, 3]
    kv.free("b")
    assert kv.pool.free_queue() == [6, 7, 8, 9, 3, 5, 4, 2, 1]
    assert kv.num_used_blocks == 0


def test_allocate_counts_evictable_blocks_and_stays_all_or_nothing() -> None:
    kv = manager(num_blocks=5)  # 4 usable
    run(kv, "a", list(range(12)))  # [1, 2, 3]
    kv.free("a")
    assert kv.num_free_blocks == 4  # one never used + three cached
    assert not kv.allocate("b", 20)  # 5 blocks: refused, nothing evicted
    assert list(kv.block_ids("b")) == []
    assert kv.pool.num_cached == 3 and kv.pool.free_queue() == [4, 3, 2, 1]
    assert kv.allocate("b", 16)
    assert list(kv.block_ids("b")) == [4, 3, 2, 1]
    assert kv.pool.num_cached == 0 and kv.pool.num_evictions == 3


def test_disabled_never_caches_or_hits() -> None:
    kv = manager(enable=False)
    run(kv, "a", list(range(12)))
    assert kv.pool.num_cached == 0
    assert kv.computed_tokens("b", list(range(12))) == 0
    assert kv.allocate("b", 12)
    assert list(kv.block_ids("b")) == [4, 5, 6]
    assert kv.prefix_cache_stats == PrefixCacheStats(0, 0)


def test_only_computed_tokens_are_cached_whatever_free_is_given() -> None:
    """After a step the sequence holds its sampled token, which has no KV yet."""
    kv = manager()
    prompt = list(range(7))
    assert kv.computed_tokens("a", prompt) == 0 and kv.allocate("a", 7)  # [1, 2]
    tokens = [*prompt, 7]  # 7 was just sampled: 8 tokens, 7 with KV
    kv.cache_blocks("a", tokens, 7)
    assert [kv.pool.block_hash(x) is not None for x in (1, 2)] == [True, False]
    kv.free("a", tokens)  # the full-looking block 2 must not be cached
    assert kv.pool.num_cached == 1
    assert kv.computed_tokens("b", [*tokens, 8]) == 4
    assert list(kv.block_ids("b")) == [1]


def test_blocks_are_cached_as_chunks_fill_them() -> None:
    kv = manager()
    tokens = list(range(13))
    assert kv.computed_tokens("a", tokens) == 0 and kv.allocate("a", 5)  # chunk of 5: [1, 2]
    kv.cache_blocks("a", tokens, 5)
    assert kv.pool.num_cached == 1
    # A second request can use it while "a" still runs.
    assert kv.computed_tokens("b", [0, 1, 2, 3, 40]) == 4 and list(kv.block_ids("b")) == [1]
    assert kv.allocate("a", 13)  # [1, 2, 3, 4]
    kv.cache_blocks("a", tokens, 13)
    assert [kv.pool.block_hash(x) for x in (1, 2, 3, 4)] == [*hash_blocks(tokens, B), None]


def test_the_first_copy_of_a_block_stays_the_cached_one() -> None:
    """Two requests computing the same prefix at once: the later copy stays private."""
    kv = manager()
    prompt = list(range(9))
    for rid in ("a", "b"):
        assert kv.computed_tokens(rid, prompt) == 0 and kv.allocate(rid, 9)
    assert list(kv.block_ids("a")) == [1, 2, 3] and list(kv.block_ids("b")) == [4, 5, 6]
    kv.cache_blocks("a", prompt, 9)
    kv.cache_blocks("b", prompt, 9)
    assert [kv.pool.block_hash(x) is not None for x in range(1, 7)] == [
        True, True, False, False, False, False]
    kv.free("b")
    kv.free("a")
    assert kv.computed_tokens("c", prompt) == 8 and list(kv.block_ids("c")) == [1, 2]
    # The chain goes on from the shared blocks: c's own third block gets cached.
    assert kv.allocate("c", 13)
    kv.cache_blocks("c", [*prompt, 9, 10, 11, 12], 13)
    assert kv.pool.block_hash(list(kv.block_ids("c"))[2]) == hash_blocks(
        [*prompt, 9, 10, 11, 12], B)[2]


def test_counters_count_each_admission_once() -> None:
    kv = manager(num_blocks=5)  # 4 usable
    run(kv, "a", list(range(8)))  # 8 queried, 0 hit
    assert kv.prefix_cache_stats == PrefixCacheStats(queries=8, hits=0)
    kv.free("a")
    run(kv, "x", [90, 91, 92, 93, 94])  # 2 blocks, evicting nothing cached: [3, 4]
    assert kv.prefix_cache_stats == PrefixCacheStats(queries=13, hits=0)
    # A request that finds a hit but cannot get its blocks gives them back and retries later;
    # only the admission that succeeds counts.
    prompt = list(range(13))
    for _ in range(3):
        assert kv.computed_tokens("b", prompt) == 8
        assert not kv.allocate("b", 13)  # needs 2 more blocks, 0 free apart from its own hits
        kv.free("b")
    assert kv.prefix_cache_stats == PrefixCacheStats(queries=13, hits=0)
    kv.free("x")
    assert kv.computed_tokens("b", prompt) == 8 and kv.allocate("b", 13)
    assert kv.prefix_cache_stats == PrefixCacheStats(queries=26, hits=8)


def test_lookup_for_a_request_holding_blocks_is_a_bug() -> None:
    kv = manager()
    assert kv.allocate("a", 4)
    with pytest.raises(RuntimeError, match="already holds KV blocks"):
        kv.computed_tokens("a", [1, 2, 3, 4, 5])


def test_caching_more_blocks_than_held_is_a_bug() -> None:
    kv = manager()
    assert kv.allocate("a", 4)
    with pytest.raises(RuntimeError, match="2 computed full blocks"):
        kv.cache_blocks("a", list(range(8)), 8)
