"""PagedKVManager: per-request block tables with exact ids, whole-block growth, all-or-nothing
allocation, and the order blocks return to the pool."""

from __future__ import annotations

import pytest

from openinfer_core.interfaces.kv import KVManager
from openinfer_kvcache import PagedKVManager

BLOCK_SIZE = 4


def manager(num_blocks: int = 16) -> PagedKVManager:
    return PagedKVManager(num_blocks=num_blocks, block_size=BLOCK_SIZE)


def test_implements_the_kv_manager_protocol():
    kv = manager()
    assert isinstance(kv, KVManager)
    assert kv.block_size == BLOCK_SIZE


@pytest.mark.parametrize(("tokens", "blocks"),
                         [(0, 0), (1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (9, 3)])
def test_allocate_covers_tokens_with_whole_blocks(tokens, blocks):
    kv = manager()
    assert kv.allocate("a", tokens)
    assert list(kv.block_ids("a")) == list(range(1, blocks + 1))
    assert kv.num_used_blocks == blocks


def test_growth_appends_only_the_missing_blocks():
    kv = manager()
    assert kv.allocate("a", 1) and list(kv.block_ids("a")) == [1]
    assert kv.allocate("a", 4) and list(kv.block_ids("a")) == [1]
    assert kv.allocate("a", 5) and list(kv.block_ids("a")) == [1, 2]
    assert kv.allocate("a", 13) and list(kv.block_ids("a")) == [1, 2, 3, 4]
    # Asking for fewer tokens than covered never shrinks the table.
    assert kv.allocate("a", 2) and list(kv.block_ids("a")) == [1, 2, 3, 4]


def test_tables_interleave_in_allocation_order():
    kv = manager()
    assert kv.allocate("a", 3)
    assert kv.allocate("b", 6)
    assert kv.allocate("a", 7)
    assert kv.allocate("c", 1)
    assert list(kv.block_ids("a")) == [1, 4]
    assert list(kv.block_ids("b")) == [2, 3]
    assert list(kv.block_ids("c")) == [5]


def test_allocation_is_all_or_nothing():
    kv = manager(num_blocks=5)  # 4 usable
    assert kv.allocate("a", 12)  # [1, 2, 3]
    assert not kv.allocate("b", 8)  # needs 2, 1 free
    assert list(kv.block_ids("b")) == []
    assert not kv.allocate("a", 20)  # needs 2 more, 1 free
    assert list(kv.block_ids("a")) == [1, 2, 3]
    assert (kv.num_used_blocks, kv.num_free_blocks) == (3, 1)
    assert kv.allocate("b", 4)
    assert list(kv.block_ids("b")) == [4]
    assert kv.num_free_blocks == 0


def test_free_returns_a_table_tail_first():
    kv = manager(num_blocks=7)  # 6 usable
    assert kv.allocate("a", 12)  # [1, 2, 3]
    assert kv.allocate("b", 8)  # [4, 5]
    kv.free("a")  # queue: 6, then 3, 2, 1
    assert list(kv.block_ids("a")) == []
    kv.free("b")  # queue: 6, 3, 2, 1, then 5, 4
    assert kv.allocate("c", 24)
    assert list(kv.block_ids("c")) == [6, 3, 2, 1, 5, 4]


def test_free_with_token_ids_releases_the_same_blocks():
    # Only cache_blocks caches: the token ids given to free change nothing.
    kv = manager(num_blocks=4)
    assert kv.allocate("a", 8)  # [1, 2]
    kv.free("a", token_ids=list(range(8)))
    assert kv.num_free_blocks == 3
    assert kv.allocate("b", 12)
    assert list(kv.block_ids("b")) == [3, 2, 1]


def test_block_counts():
    kv = manager(num_blocks=10)
    assert (kv.num_total_blocks, kv.num_used_blocks, kv.num_free_blocks) == (9, 0, 9)
    kv.allocate("a", 9)
    kv.allocate("b", 1)
    assert (kv.num_total_blocks, kv.num_used_blocks, kv.num_free_blocks) == (9, 4, 5)
    kv.free("a")
    assert (kv.num_total_blocks, kv.num_used_blocks, kv.num_free_blocks) == (9, 1, 8)


def test_freeing_an_unknown_or_freed_request_is_a_no_op():
    kv = manager()
    kv.allocate("a", 5)
    kv.free("nobody")
    kv.free("a")
    kv.free("a")
    assert (kv.num_used_blocks, kv.num_free_blocks) == (0, 15)


def test_computed_tokens_is_zero_and_allocates_nothing():
    kv = manager()
    assert kv.computed_tokens("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]) == 0
    assert list(kv.block_ids("a")) == []
    assert kv.num_free_blocks == 15
    assert kv.allocate("a", 9)
    assert list(kv.block_ids("a")) == [1, 2, 3]


def test_unknown_request_has_an_empty_table():
    assert list(manager().block_ids("nobody")) == []


def test_block_size_must_be_positive():
    with pytest.raises(ValueError, match="block_size"):
        PagedKVManager(num_blocks=4, block_size=0)
