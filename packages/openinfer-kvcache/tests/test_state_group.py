"""GroupedKVManager with a state group (one slot per request) beside a full and a window
group: the slot is taken at the first allocate and kept whatever the length, allocation stays
all or nothing across groups, free gives it back, usage counts slots, and no prefix is ever
hit or cached."""

from __future__ import annotations

import pytest

from openinfer_core.interfaces.kv import GroupedKV, KVGroupSpec, KVGroupUsage, OffloadableKV
from openinfer_kvcache import GroupedKVManager

B = 4  # block size
STATE = KVGroupSpec("state", state=True)
FULL = KVGroupSpec("full")
W = KVGroupSpec("w", horizon=4)
TOKENS = list(range(13))


def manager(slots: int = 4, full_blocks: int = 20, enable: bool = True) -> GroupedKVManager:
    """The state group first, so that group 0 is not the full group."""
    return GroupedKVManager((STATE, FULL, W), (slots, full_blocks, 10), B, enable)


def test_a_state_group_spec() -> None:
    assert STATE.state and not STATE.is_full and not STATE.is_window
    assert FULL.is_full and not FULL.is_window and W.is_window and not W.is_full
    with pytest.raises(ValueError, match="a state group has no horizon"):
        KVGroupSpec("s", horizon=3, state=True)


def test_one_slot_per_request_from_the_first_allocate_until_free() -> None:
    kv = manager()
    # OffloadableKV, but without a prefix cache nothing is ever sealed (the engine refuses
    # --kv-offload for a state group).
    assert isinstance(kv, GroupedKV) and isinstance(kv, OffloadableKV)
    assert kv.group_block_ids("a") == ((), (), ())
    assert kv.computed_tokens("a", TOKENS) == 0
    assert kv.allocate("a", 5)
    assert kv.group_block_ids("a") == ([1], [1, 2], [1, 2])
    assert kv.allocate("b", 1)
    assert kv.group_block_ids("b") == ([2], [3], [3])
    # Growing keeps the slot; a decode inside the last block takes nothing.
    assert kv.allocate("a", 13) and kv.allocate("a", 13)
    assert kv.group_block_ids("a") == ([1], [1, 2, 4, 5], [1, 2, 4, 5])
    kv.cache_blocks("a", TOKENS, 13)  # gives back the window's blocks, keeps the slot
    assert kv.group_block_ids("a") == ([1], [1, 2, 4, 5], [0, 0, 4, 5])
    assert kv.block_ids("a") == [1, 2, 4, 5]  # the full group's
    assert kv.group_usage()[0] == KVGroupUsage("state", 3, 2, 1, 0)
    kv.free("a")
    assert kv.group_usage()[0] == KVGroupUsage("state", 3, 1, 2, 0)
    assert kv.allocate("c", 2)
    assert kv.group_block_ids("c")[0] == [3]  # the oldest free slot first
    kv.free("b")
    kv.free("c")
    kv.free("nobody")
    assert [u.used for u in kv.group_usage()] == [0, 0, 0]
    assert kv.num_used_blocks == 0 and kv.num_free_blocks == 19


def test_allocation_waits_for_a_slot_all_or_nothing() -> None:
    kv = manager(slots=3)  # two slots
    assert kv.allocate("a", 4) and kv.allocate("b", 4)
    before = [u.free for u in kv.group_usage()]
    assert not kv.allocate("c", 4)  # no slot: no block taken in any group
    assert [u.free for u in kv.group_usage()] == before
    assert [list(t) for t in kv.group_block_ids("c")] == [[], [], []]
    # A running request grows without a new slot even with none free.
    assert kv.allocate("a", 12)
    # Out of full blocks, a new request gets no slot either.
    small = manager(slots=4, full_blocks=3)
    assert small.allocate("a", 8)
    assert not small.allocate("b", 1)
    assert small.group_usage()[0].used == 1
    kv.free("a")
    assert kv.allocate("c", 4)
    assert kv.group_block_ids("c")[0] == [1]


@pytest.mark.parametrize("enable", [True, False])
def test_no_prefix_is_hit_or_cached(enable: bool) -> None:
    kv = manager(enable=enable)
    assert kv.computed_tokens("a", TOKENS) == 0
    assert kv.allocate("a", 13)
    kv.cache_blocks("a", TOKENS, 13)
    kv.free("a")
    assert kv.computed_tokens("b", [*TOKENS, 99]) == 0
    assert kv.allocate("b", 14)
    assert all(u.cached == 0 for u in kv.group_usage())
    assert kv.prefix_cache_stats.hits == 0
    with pytest.raises(RuntimeError, match="already holds KV blocks"):
        kv.computed_tokens("b", TOKENS)
