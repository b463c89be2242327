"""GroupedKVManager with 4-token blocks: exact block ids per group as window groups give back
blocks out of their horizon, prefix hits that need only a window's tail and are cut short
where it is gone, all-or-nothing allocation across groups, the protocols, and the offload side
(which block of each group a sealed position names, restores that reserve the full groups and
then only the window's tail)."""

from __future__ import annotations

import pytest

from openinfer_core.interfaces.kv import (
    GroupedKV,
    KVGroupSpec,
    KVGroupUsage,
    KVManager,
    OffloadableKV,
    PrefixCacheStats,
    SealedBlock,
)
from openinfer_kvcache import GroupedKVManager, PagedKVManager
from openinfer_kvcache.block_hash import hash_blocks

B = 4  # block size
FULL = KVGroupSpec("full")
W = KVGroupSpec("w", horizon=4)
TOKENS = list(range(13))


def manager(full_blocks: int = 20, window_blocks: int = 10,
            enable: bool = True) -> GroupedKVManager:
    return GroupedKVManager((FULL, W), (full_blocks, window_blocks), B, enable)


def run_a(kv: GroupedKVManager) -> None:
    """"a" computes TOKENS in two steps (10, then 3 tokens) and caches what it computed."""
    assert kv.computed_tokens("a", TOKENS) == 0
    assert kv.allocate("a", 10)
    kv.cache_blocks("a", TOKENS, 10)
    assert kv.allocate("a", 13)
    kv.cache_blocks("a", TOKENS, 13)


def test_protocols() -> None:
    kv = manager()
    assert isinstance(kv, KVManager) and isinstance(kv, GroupedKV)
    assert isinstance(kv, OffloadableKV)  # group by group: test_grouped_offload.py
    paged = PagedKVManager(8, B)
    assert isinstance(paged, GroupedKV) and isinstance(paged, OffloadableKV)
    assert paged.groups == (FULL,)
    assert paged.group_block_ids("nobody") == ((),)


@pytest.mark.parametrize("enable", [True, False])
def test_blocks_out_of_the_window_become_padding_and_go_back(enable: bool) -> None:
    kv = manager(enable=enable)
    assert kv.computed_tokens("a", TOKENS) == 0
    assert kv.allocate("a", 10)
    assert kv.group_block_ids("a") == ([1, 2, 3], [1, 2, 3])
    kv.cache_blocks("a", TOKENS, 10)  # later tokens read positions >= 6: block 0 goes
    assert kv.group_block_ids("a") == ([1, 2, 3], [0, 2, 3])
    assert kv.pools[1].free_queue() == [4, 5, 6, 7, 8, 9, 1]
    assert kv.allocate("a", 13)
    kv.cache_blocks("a", TOKENS, 13)  # positions >= 9: block 1 goes
    assert list(kv.block_ids("a")) == [1, 2, 3, 4]
    assert kv.group_block_ids("a") == ([1, 2, 3, 4], [0, 0, 3, 4])
    assert kv.group_usage() == (KVGroupUsage("full", 19, 4, 15, 3 if enable else 0),
                                KVGroupUsage("w", 9, 2, 7, 3 if enable else 0))
    assert (kv.num_total_blocks, kv.num_used_blocks, kv.num_free_blocks) == (19, 4, 15)
    # Released blocks stay findable under the same chain hash as the full group's.
    hashes = hash_blocks(TOKENS, B)
    assert [kv.pools[1].block_hash(b) for b in (1, 2, 3)] == (
        hashes if enable else [None, None, None])
    kv.free("a")
    assert kv.pools[1].free_queue() == [5, 6, 7, 8, 9, 1, 2, 4, 3]
    assert [u.used for u in kv.group_usage()] == [0, 0]


def test_a_horizon_past_the_tokens_keeps_every_block_and_zero_keeps_the_open_block() -> None:
    kv = GroupedKVManager((FULL, KVGroupSpec("long", 100), KVGroupSpec("own", 0)),
                          (10, 10, 10), B)
    assert kv.allocate("a", 10)
    kv.cache_blocks("a", TOKENS, 10)
    assert kv.group_block_ids("a") == ([1, 2, 3], [1, 2, 3], [0, 0, 3])
    kv.cache_blocks("a", TOKENS, 8)  # a lagging count gives nothing back again
    assert kv.group_block_ids("a") == ([1, 2, 3], [1, 2, 3], [0, 0, 3])


def test_a_hit_attaches_only_the_window_tail() -> None:
    kv = manager()
    run_a(kv)
    kv.free("a")
    prompt = [*TOKENS[:13], 50]
    # Three blocks cached; a step after 12 tokens reads positions >= 8: block 2 only.
    assert kv.computed_tokens("b", prompt) == 12
    assert kv.group_block_ids("b") == ([1, 2, 3], [0, 0, 3])
    assert [kv.pools[1].ref_count(b) for b in (1, 2, 3, 4)] == [0, 0, 1, 0]
    assert kv.allocate("b", len(prompt))
    assert kv.group_block_ids("b") == ([1, 2, 3, 5], [0, 0, 3, 5])
    assert kv.prefix_cache_stats == PrefixCacheStats(queries=13 + 14, hits=12)
    kv.cache_blocks("b", prompt, 14)  # positions >= 10: block 2 stays
    assert kv.group_block_ids("b") == ([1, 2, 3, 5], [0, 0, 3, 5])
    kv.free("b")
    assert [u.used for u in kv.group_usage()] == [0, 0]


def small_window_after_a() -> GroupedKVManager:
    """Window pool of 5 blocks: after "a" and its free, its queue is [5, 2, 1, 4, 3]: 2
    holds block position 1's KV, 1 position 0's, 3 position 2's."""
    kv = manager(full_blocks=30, window_blocks=6)
    assert kv.computed_tokens("a", TOKENS) == 0 and kv.allocate("a", 13)
    kv.cache_blocks("a", TOKENS, 13)
    assert kv.group_block_ids("a") == ([1, 2, 3, 4], [0, 0, 3, 4])
    kv.free("a")
    assert kv.pools[1].free_queue() == [5, 2, 1, 4, 3]
    return kv


def test_a_hit_is_cut_where_the_window_tail_was_evicted() -> None:
    kv = small_window_after_a()
    assert kv.computed_tokens("x", list(range(100, 108))) == 0
    assert kv.allocate("x", 8)  # takes window blocks 5 and 2: position 1's KV is gone
    assert kv.group_block_ids("x") == ([5, 6], [5, 2])
    prompt = [*TOKENS[:8], 70, 71, 72]
    # The full group has positions 0 and 1; a hit of 8 would read position 1's window KV.
    assert kv.computed_tokens("b", prompt) == 4
    assert kv.group_block_ids("b") == ([1], [1])
    assert kv.allocate("b", len(prompt))
    kv.free("b")
    kv.free("x")
    assert [u.used for u in kv.group_usage()] == [0, 0]


def test_a_window_block_before_the_tail_is_not_needed() -> None:
    kv = small_window_after_a()
    prompt = [*TOKENS[:8], 70, 71, 72]
    assert kv.computed_tokens("probe", prompt) == 8  # touching position 1's block renews it
    kv.free("probe")
    assert kv.pools[1].free_queue() == [5, 1, 4, 3, 2]
    assert kv.computed_tokens("x", list(range(100, 108))) == 0
    assert kv.allocate("x", 8)  # takes 5 and 1: position 0's window KV is gone
    assert kv.computed_tokens("b", prompt) == 8
    assert kv.group_block_ids("b") == ([1, 2], [0, 2])


def test_allocation_is_all_or_nothing_across_groups() -> None:
    kv = manager(full_blocks=20, window_blocks=4)  # the window pool has 3 blocks
    assert kv.computed_tokens("a", TOKENS) == 0 and kv.allocate("a", 12)
    assert kv.computed_tokens("b", [90, 91, 92]) == 0
    assert not kv.allocate("b", 3)  # the full pool has room, the window pool none
    assert kv.group_block_ids("b") == ([], [])
    assert [u.free for u in kv.group_usage()] == [16, 0]
    assert not kv.allocate("a", 13)
    assert kv.group_block_ids("a") == ([1, 2, 3], [1, 2, 3])
    assert kv.prefix_cache_stats == PrefixCacheStats(queries=13, hits=0)  # b not admitted
    kv.cache_blocks("a", TOKENS, 12)  # positions >= 8: blocks 0 and 1 go back
    assert kv.allocate("b", 3)
    assert kv.group_block_ids("b") == ([4], [2])  # 2 was given back first (tail first)
    assert kv.prefix_cache_stats == PrefixCacheStats(queries=16, hits=0)


def test_the_first_full_group_is_the_kv_manager_view_and_every_full_group_must_hit() -> None:
    kv = GroupedKVManager((W, FULL, KVGroupSpec("indexer")), (10, 12, 14), B)
    run_a(kv)
    assert kv.pool is kv.pools[1]
    assert (kv.num_total_blocks, kv.num_used_blocks, kv.num_free_blocks) == (11, 4, 7)
    assert kv.group_block_ids("a") == ([0, 0, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4])
    assert list(kv.block_ids("a")) == [1, 2, 3, 4]
    kv.free("a")
    assert kv.computed_tokens("b", [*TOKENS, 1]) == 12
    kv.free("b")
    # A request of 13 blocks takes every "indexer" block, evicting a's KV there, while the
    # larger "full" and "w" pools keep theirs.
    kv = GroupedKVManager((W, FULL, KVGroupSpec("indexer")), (20, 20, 14), B)
    run_a(kv)
    kv.free("a")
    assert kv.computed_tokens("c", list(range(200, 252))) == 0 and kv.allocate("c", 52)
    kv.free("c")
    assert kv.pools[1].lookup(hash_blocks(TOKENS, B)[0]) is not None
    assert kv.pools[2].lookup(hash_blocks(TOKENS, B)[0]) is None
    assert kv.computed_tokens("d", [*TOKENS, 1]) == 0


def test_bugs_and_mistakes_fail_loudly() -> None:
    kv = manager()
    assert kv.allocate("a", 4)
    with pytest.raises(RuntimeError, match="already holds KV blocks"):
        kv.computed_tokens("a", [1, 2, 3, 4, 5])
    with pytest.raises(RuntimeError, match="2 computed full blocks"):
        kv.cache_blocks("a", list(range(8)), 8)
    with pytest.raises(ValueError, match="full group"):
        GroupedKVManager((W,), (4,), B)
    with pytest.raises(ValueError, match="2 KV groups but 1"):
        GroupedKVManager((FULL, W), (4,), B)
    with pytest.raises(ValueError, match="names must differ"):
        GroupedKVManager((FULL, KVGroupSpec("full", 3)), (4, 4), B)
    with pytest.raises(ValueError, match="horizon"):
        KVGroupSpec("w", -1)
    with pytest.raises(ValueError, match="block_size"):
        GroupedKVManager((FULL,), (4,), 0)


def test_sealed_positions_name_the_window_block_only_while_held() -> None:
    kv = manager()
    kv.track_sealed()
    run_a(kv)
    h = hash_blocks(TOKENS, B)
    # After 10 tokens the window group gave block 1 (position 0) back in the same call that
    # sealed it; position 1's block was held then, and is still findable.
    assert kv.take_sealed() == [SealedBlock(h[0], (1, None)), SealedBlock(h[1], (2, 2)),
                                SealedBlock(h[2], (3, 3))]
    assert kv.take_sealed() == []
    kv.hold([2], 1)  # a copy reads window block 2, freed by "a" meanwhile
    kv.free("a")
    assert kv.pools[1].ref_count(2) == 1
    kv.release([2], 1)
    assert kv.pools[1].ref_count(2) == 0


def test_a_restore_reserves_full_blocks_then_the_window_tail() -> None:
    kv = manager()
    assert kv.computed_tokens("b", TOKENS) == 0
    assert kv.reserve("b", 12)
    assert kv.group_block_ids("b") == ([1, 2, 3], [0, 0, 0])
    assert kv.reserve_window_tail("b", 12)  # a step after 12 tokens reads positions >= 8
    assert kv.group_block_ids("b") == ([1, 2, 3], [0, 0, 1])
    kv.cache_blocks("b", TOKENS, 12)  # the copies landed
    kv.free("b")
    assert kv.computed_tokens("c", TOKENS) == 12
    assert kv.group_block_ids("c") == ([1, 2, 3], [0, 0, 1])
    assert kv.prefix_cache_stats.queries == 0  # neither is admitted yet
    kv.free("c")


def test_a_restore_without_its_window_tail_makes_no_hit() -> None:
    kv = manager()
    assert kv.computed_tokens("b", TOKENS) == 0
    assert kv.reserve("b", 12)
    kv.cache_blocks("b", TOKENS, 12)  # padding window entries are not sealed
    kv.free("b")
    assert kv.pools[1].num_cached == 0
    assert kv.computed_tokens("c", TOKENS) == 0
