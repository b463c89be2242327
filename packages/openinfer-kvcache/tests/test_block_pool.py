"""BlockPool: exact block ids handed out, the free-queue order, reference counts, and loud
failures on bookkeeping bugs."""

from __future__ import annotations

import pytest

from openinfer_kvcache import PADDING_BLOCK, BlockPool


def test_padding_block_is_zero_and_never_handed_out():
    pool = BlockPool(6)
    assert PADDING_BLOCK == 0
    assert pool.num_usable == 5 and pool.num_free == 5
    assert pool.allocate(5) == [1, 2, 3, 4, 5]
    assert pool.num_free == 0
    assert pool.ref_count(PADDING_BLOCK) == 0


def test_allocates_in_id_order_across_calls():
    pool = BlockPool(10)
    assert pool.allocate(3) == [1, 2, 3]
    assert pool.allocate(1) == [4]
    assert pool.allocate(0) == []
    assert pool.allocate(2) == [5, 6]
    assert pool.num_free == 3


def test_freed_blocks_queue_behind_never_used_ones_in_the_order_given():
    pool = BlockPool(8)
    assert pool.allocate(4) == [1, 2, 3, 4]
    pool.free([4, 2])
    pool.free([1])
    # Queue: 5, 6, 7 (never used), then 4, 2, 1 (oldest-freed first).
    assert pool.allocate(4) == [5, 6, 7, 4]
    assert pool.allocate(2) == [2, 1]
    assert pool.num_free == 0


def test_free_accepts_any_iterable():
    pool = BlockPool(5)
    blocks = pool.allocate(4)
    pool.free(reversed(blocks))
    assert pool.allocate(4) == [4, 3, 2, 1]


def test_ref_counts():
    pool = BlockPool(5)
    assert [pool.ref_count(b) for b in range(5)] == [0, 0, 0, 0, 0]
    pool.allocate(2)
    assert [pool.ref_count(b) for b in range(5)] == [0, 1, 1, 0, 0]
    pool.free([2])
    assert [pool.ref_count(b) for b in range(5)] == [0, 1, 0, 0, 0]
    assert pool.allocate(3) == [3, 4, 2]
    assert [pool.ref_count(b) for b in range(5)] == [0, 1, 1, 1, 1]


def test_allocating_more_than_free_raises_and_changes_nothing():
    pool = BlockPool(5)
    pool.allocate(2)
    with pytest.raises(RuntimeError, match="asked for 3 KV blocks, 2 free"):
        pool.allocate(3)
    assert pool.num_free == 2
    assert pool.allocate(2) == [3, 4]


def test_double_free_raises():
    pool = BlockPool(5)
    pool.allocate(2)
    pool.free([1])
    with pytest.raises(RuntimeError, match="block 1"):
        pool.free([1])
    assert pool.allocate(3) == [3, 4, 1]  # the failed free queued nothing


@pytest.mark.parametrize("block", [PADDING_BLOCK, 3], ids=["padding", "never-allocated"])
def test_freeing_a_block_not_held_raises(block):
    pool = BlockPool(5)
    pool.allocate(2)
    with pytest.raises(RuntimeError, match=f"block {block}"):
        pool.free([block])
    assert pool.num_free == 2


def test_freeing_an_id_outside_the_pool_fails_loudly():
    pool = BlockPool(5)
    pool.allocate(4)
    with pytest.raises((RuntimeError, IndexError)):
        pool.free([5])


def test_freeing_a_negative_id_fails_loudly():
    pool = BlockPool(5)
    assert pool.allocate(4) == [1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="freeing KV block -1"):
        pool.free([-1])
    assert pool.ref_count(4) == 1 and pool.allocate(0) == []


@pytest.mark.parametrize("num_blocks", [0, 1])
def test_needs_a_usable_block_besides_padding(num_blocks):
    with pytest.raises(ValueError, match="at least 2 blocks"):
        BlockPool(num_blocks)


def test_cached_block_is_findable_until_handed_out_again():
    pool = BlockPool(4)
    assert pool.allocate(2) == [1, 2]
    assert pool.cache(1, 111) and pool.lookup(111) == 1 and pool.block_hash(1) == 111
    assert pool.cache(1, 111)  # again, same hash: nothing changes
    pool.free([2, 1])
    assert pool.free_queue() == [3, 2, 1] and pool.lookup(111) == 1
    assert pool.allocate(2) == [3, 2]
    assert pool.lookup(111) == 1 and pool.num_evictions == 0
    assert pool.allocate(1) == [1]
    assert pool.lookup(111) is None and pool.block_hash(1) is None
    assert pool.num_evictions == 1 and pool.num_cached == 0


def test_a_hash_stays_with_its_first_block():
    pool = BlockPool(4)
    pool.allocate(2)
    assert pool.cache(1, 7)
    assert not pool.cache(2, 7)
    assert pool.lookup(7) == 1 and pool.block_hash(2) is None
    with pytest.raises(RuntimeError, match="another hash"):
        pool.cache(1, 8)


def test_touch_revives_a_free_cached_block_and_shares_a_held_one():
    pool = BlockPool(5)
    pool.allocate(2)
    pool.cache(1, 11)
    pool.cache(2, 22)
    pool.free([1])
    assert pool.free_queue() == [3, 4, 1]
    pool.touch([1, 2])
    assert pool.free_queue() == [3, 4]
    assert (pool.ref_count(1), pool.ref_count(2)) == (1, 2)


@pytest.mark.parametrize("op", ["touch", "cache"])
def test_touching_an_uncached_or_caching_a_free_block_raises(op):
    pool = BlockPool(4)
    with pytest.raises(RuntimeError, match="block 1"):
        pool.touch([1]) if op == "touch" else pool.cache(1, 5)
