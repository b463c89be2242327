"""How many blocks a window group's pool needs so that it never refuses a step the full
group accepts, and how many slots a state group's pool holds."""

from __future__ import annotations

from collections.abc import Sequence

from openinfer_core.interfaces.kv import SCRATCH_STATE_SLOTS, KVGroupSpec, KVStepLimits


def window_pool_blocks(horizon: int, block_size: int, max_num_seqs: int,
                       max_num_batched_tokens: int) -> int:
    """The smallest pool size (`num_blocks`, the padding block included) with which a window
    group of `horizon` never refuses an `allocate`, under the scheduler's limits: at most
    `max_num_seqs` rows a step, `max_num_batched_tokens` new tokens in all.

    Why it is enough. The scheduler allocates a step after the last step's `cache_blocks`
    told the manager each running request's `c` computed tokens, which gave back the blocks
    before position c - horizon. A row of k new tokens thus holds the blocks of positions
    [c - horizon, c + k): its new tokens' entries are all written this step, and each reads
    `horizon` before it. L = horizon + k positions touch at most (L - 2) // block_size + 2
    blocks (when the first one sits at a block's last slot). Summed over the rows, that is
    largest with as many rows as allowed, one token each, then the rest of the budget spent
    where it crosses the next block boundary soonest: a row's first extra block costs
    `first` more tokens, each later one `block_size`. A prefix hit attaches no more than the
    same row would hold, and blocks given back to the pool stay evictable, so cached
    window tails never refuse an allocation; they are what a pool larger than this keeps
    for prefix hits under load.

    Not sized here: a step launched before the previous one's `cache_blocks` (the engine
    never does this) would hold one step more."""
    if min(block_size, max_num_seqs, max_num_batched_tokens) < 1 or horizon < 0:
        raise ValueError(f"window_pool_blocks({horizon}, {block_size}, {max_num_seqs}, "
                         f"{max_num_batched_tokens}): horizon must be >= 0, the rest >= 1")
    rows = min(max_num_seqs, max_num_batched_tokens)
    blocks = rows * ((horizon - 1) // block_size + 2)  # every row with one new token
    extra = max_num_batched_tokens - rows
    first = block_size - (horizon - 1) % block_size
    crossings = min(rows, extra // first)
    blocks += crossings + (extra - crossings * first) // block_size
    return blocks + 1  # the padding block


def periodic_pool_blocks(period: int, num_blocks: int, block_size: int,
                         max_num_seqs: int) -> int:
    """The pool size with which a full group of `period` (`KVGroupSpec.period`) never refuses
    an `allocate` that a full group of `num_blocks` accepts: `num_blocks` where every block
    holds a position k * period - 1 (period <= block_size), else one block per `period`
    tokens of the plain group's usable blocks, plus one per running request and the padding
    block. Why it is enough: the periodic group holds a block where the plain group holds
    one at a position that holds such a token, under the same prefix hash. The plain blocks
    the requests hold (at most num_blocks - 1) are a tree of shared prefixes, which splits
    into one run of consecutive positions per request; a run of m positions holds at most
    m * block_size // period + 1 of them."""
    if period <= block_size:
        return num_blocks
    return (num_blocks - 1) * block_size // period + max_num_seqs + 1


def group_pool_blocks(groups: Sequence[KVGroupSpec], num_blocks: int, block_size: int,
                      limits: KVStepLimits | None) -> tuple[int, ...]:
    """Each group's pool size for `GroupedKVManager` (`num_blocks_per_group`), as
    `capabilities.SupportsKVGroups.create_kv_cache` is given them: `num_blocks` for a full
    group (`periodic_pool_blocks` for a periodic one), `window_pool_blocks` for a window
    group, `max_num_seqs + 1` slots for a state group (one per running request, and the
    padding slot: admission never runs more requests).

    Without `limits` (start-up's scratch caches): `num_blocks` in every token group and
    `min(num_blocks, SCRATCH_STATE_SLOTS)` slots in a state group, since a slot is a whole
    request's state (megabytes); scratch batches use slots below that bound
    (`openinfer_core.engine.batch.scratch_group_tables`)."""
    if limits is None:
        return tuple(min(num_blocks, SCRATCH_STATE_SLOTS) if g.state else num_blocks
                     for g in groups)
    return tuple(limits.max_num_seqs + 1 if g.state
                 else periodic_pool_blocks(g.period, num_blocks, block_size,
                                           limits.max_num_seqs) if g.horizon is None
                 else window_pool_blocks(g.horizon, block_size, limits.max_num_seqs,
                                         limits.max_num_batched_tokens)
                 for g in groups)
