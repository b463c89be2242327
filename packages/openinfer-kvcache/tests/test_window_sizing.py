"""window_pool_blocks: values, and a step that needs exactly that many window blocks (so the
bound is tight; the engine-like random run in test_grouped_random checks it is enough)."""

from __future__ import annotations

import pytest

from openinfer_core.interfaces.kv import SCRATCH_STATE_SLOTS, KVGroupSpec, KVStepLimits
from openinfer_kvcache import FULL_GROUP, GroupedKVManager, group_pool_blocks, window_pool_blocks

B = 4


@pytest.mark.parametrize(("horizon", "seqs", "budget", "blocks"), [
    (5, 3, 3, 3 * 3 + 1),  # decode only: 6 positions touch at most 3 blocks each
    (4, 3, 3, 3 * 2 + 1),  # 5 positions: at most 2 blocks
    (5, 3, 12, 11 + 1),  # two rows cross one more boundary each (4 more tokens apiece)
    (0, 2, 2, 2 + 1),  # a row reads only its own entry
    (0, 2, 9, 2 + 2 + 1 + 1),  # 2 crossings at 1 token each, 1 more at 4 tokens
    (5, 8, 3, 3 * 3 + 1),  # never more rows than tokens
])
def test_values(horizon: int, seqs: int, budget: int, blocks: int) -> None:
    assert window_pool_blocks(horizon, B, seqs, budget) == blocks


def test_engine_defaults_for_a_window_of_128() -> None:
    # 256 rows of 9 blocks, 256 boundary crossings at 2 tokens, 464 more blocks of 16.
    assert window_pool_blocks(127, 16, 256, 8192) == 256 * 9 + 256 + 464 + 1


def test_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="horizon must be >= 0"):
        window_pool_blocks(-1, B, 1, 1)
    with pytest.raises(ValueError, match="the rest >= 1"):
        window_pool_blocks(4, B, 0, 1)


@pytest.mark.parametrize("spare", [0, -1])
def test_a_worst_step_needs_every_block(spare: int) -> None:
    """Horizon 5, 3 rows, 12 tokens: each request at 8 computed tokens keeps positions 3..7
    (blocks 0 and 1); then rows of 5, 5 and 2 tokens need blocks 0..3, 0..3 and 0..2."""
    horizon, seqs, budget = 5, 3, 12
    size = window_pool_blocks(horizon, B, seqs, budget) + spare
    kv = GroupedKVManager((FULL_GROUP, KVGroupSpec("w", horizon)), (64, size), B, False)
    tokens = list(range(20))
    for rid in "abc":
        assert kv.allocate(rid, 8)
        kv.cache_blocks(rid, tokens, 8)
    assert kv.group_usage()[1].used == 6
    steps = [kv.allocate("a", 13), kv.allocate("b", 13), kv.allocate("c", 10)]
    assert steps == [True, True, spare == 0]
    assert kv.group_usage()[1].free == 0


def test_group_pools_are_full_blocks_or_window_bounds() -> None:
    groups = (KVGroupSpec("w", 127), FULL_GROUP, KVGroupSpec("w8", 7))
    limits = KVStepLimits(max_num_seqs=256, max_num_batched_tokens=8192)
    assert group_pool_blocks(groups, 1000, 16, limits) == (
        window_pool_blocks(127, 16, 256, 8192), 1000, window_pool_blocks(7, 16, 256, 8192))
    assert group_pool_blocks(groups, 9, 16, None) == (9, 9, 9)  # a scratch cache


def test_a_state_pool_is_a_slot_per_running_request_and_small_in_scratch_caches() -> None:
    groups = (KVGroupSpec("state", state=True), FULL_GROUP, KVGroupSpec("w", 7))
    limits = KVStepLimits(max_num_seqs=256, max_num_batched_tokens=8192)
    assert group_pool_blocks(groups, 1000, 16, limits) == (
        257, 1000, window_pool_blocks(7, 16, 256, 8192))
    # Scratch caches: every token group `num_blocks`, a state group at most 9 slots.
    assert group_pool_blocks(groups, 5000, 16, None) == (SCRATCH_STATE_SLOTS, 5000, 5000)
    assert group_pool_blocks(groups, 3, 16, None) == (3, 3, 3)
    assert SCRATCH_STATE_SLOTS == 9
