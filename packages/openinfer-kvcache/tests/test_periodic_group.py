"""A periodic full group (`KVGroupSpec.period`) in GroupedKVManager, 4-token blocks and period
8: a block only at the positions whose blocks hold a token 8k - 1 (odd block positions), exact
block ids, prefix hits that attach them and are cut where one is gone, and a pool of
`periodic_pool_blocks` that never refuses what the plain full group accepts."""

from __future__ import annotations

import random

import pytest

from openinfer_core.interfaces.kv import KVGroupSpec, KVGroupUsage, KVStepLimits
from openinfer_kvcache import GroupedKVManager, group_pool_blocks, periodic_pool_blocks
from openinfer_kvcache.block_hash import hash_blocks

B = 4
FULL = KVGroupSpec("full")
P = KVGroupSpec("p", period=8)
TOKENS = list(range(21))


def test_the_blocks_a_periodic_group_holds() -> None:
    assert [P.holds_block(i, B) for i in range(6)] == [False, True] * 3
    # a period that is no multiple of the block size: positions 5, 11, 17 in blocks 1, 2, 4
    assert [KVGroupSpec("q", period=6).holds_block(i, B) for i in range(5)] == [
        False, True, True, False, True]
    assert all(KVGroupSpec("r", period=3).holds_block(i, B) for i in range(9))
    assert all(FULL.holds_block(i, B) for i in range(9))
    for bad in ({"period": 0}, {"period": 2, "horizon": 3}, {"period": 2, "state": True}):
        with pytest.raises(ValueError, match="period"):
            KVGroupSpec("x", **bad)  # type: ignore[arg-type]


def test_tables_hold_a_block_every_other_position_and_hits_attach_them() -> None:
    kv = GroupedKVManager((FULL, P), (20, 10), B)
    assert kv.computed_tokens("a", TOKENS) == 0
    assert kv.allocate("a", 10)
    assert kv.group_block_ids("a") == ([1, 2, 3], [0, 1, 0])
    kv.cache_blocks("a", TOKENS, 10)
    assert kv.allocate("a", 21)
    kv.cache_blocks("a", TOKENS, 21)
    # block position 5 holds position 23, which the next tokens will reach
    assert kv.group_block_ids("a") == ([1, 2, 3, 4, 5, 6], [0, 1, 0, 2, 0, 3])
    hashes = hash_blocks(TOKENS, B)
    assert [kv.pools[1].block_hash(b) for b in (1, 2)] == [hashes[1], hashes[3]]
    assert kv.group_usage() == (KVGroupUsage("full", 19, 6, 13, 5),
                                KVGroupUsage("p", 9, 3, 6, 2))
    kv.free("a")
    assert kv.computed_tokens("b", [*TOKENS[:16], 99]) == 16
    assert kv.group_block_ids("b") == ([1, 2, 3, 4], [0, 1, 0, 2])
    assert kv.allocate("b", 17)
    assert kv.group_block_ids("b") == ([1, 2, 3, 4, 7], [0, 1, 0, 2, 0])
    kv.free("b")


def test_a_hit_is_cut_where_a_periodic_block_was_evicted() -> None:
    kv = GroupedKVManager((FULL, P), (40, 4), B)  # "p" has 3 blocks
    assert kv.computed_tokens("a", TOKENS) == 0 and kv.allocate("a", 21)
    kv.cache_blocks("a", TOKENS, 21)
    kv.free("a")
    # c's 3 "p" blocks take a's two (block positions 1 and 3) and the third free one.
    other = list(range(100, 124))
    assert kv.computed_tokens("c", other) == 0 and kv.allocate("c", 24)
    assert kv.group_block_ids("c")[1] == [0, 3, 0, 2, 0, 1]
    kv.free("c")
    assert kv.computed_tokens("d", TOKENS) == 4  # block 0 holds nothing of "p": still a hit


def test_pool_sizes() -> None:
    assert periodic_pool_blocks(8, 101, 4, 5) == 50 + 6
    assert periodic_pool_blocks(4, 101, 4, 5) == 101
    assert periodic_pool_blocks(128, 4097, 16, 256) == 512 + 257
    limits = KVStepLimits(max_num_seqs=3, max_num_batched_tokens=64)
    assert group_pool_blocks((FULL, P), 41, B, limits) == (41, 24)
    assert group_pool_blocks((FULL, P), 41, B, None) == (41, 41)


def test_requests_branching_just_before_a_periodic_block_fit() -> None:
    """The worst case: every request shares block 0 and owns block 1, which holds position 7.
    The plain group holds 5 blocks, the periodic one 4, above 5 * 4 // 8: the running
    requests' share."""
    seqs = 4
    pools = group_pool_blocks((FULL, P), 6, B, KVStepLimits(seqs, 64))
    kv = GroupedKVManager((FULL, P), pools, B)
    stem = [1, 2, 3, 4]
    assert kv.computed_tokens("a", stem) == 0 and kv.allocate("a", 4)
    kv.cache_blocks("a", stem, 4)
    kv.free("a")
    for i in range(seqs):
        tokens = [*stem, 10 + i, 5, 6, 7, 8]
        assert kv.computed_tokens(f"r{i}", tokens) == 4
        assert kv.allocate(f"r{i}", 8)
        kv.cache_blocks(f"r{i}", tokens, 8)
    assert [u.used for u in kv.group_usage()] == [5, 4]


@pytest.mark.parametrize("seed", range(4))
def test_a_periodic_pool_never_refuses_what_the_full_group_accepts(seed: int) -> None:
    """Requests that share prefixes of a few stems, admitted, grown and freed at random: the
    worst case for the periodic pool is many requests whose private blocks start just before
    a block it holds."""
    rng = random.Random(seed)
    seqs, full_blocks = 4, 30
    pools = group_pool_blocks((FULL, P), full_blocks, B, KVStepLimits(seqs, 64))
    kv = GroupedKVManager((FULL, P), pools, B)
    stems = [[rng.randrange(50) for _ in range(rng.randrange(2, 12))] for _ in range(3)]
    running: dict[str, list[int]] = {}
    for step in range(300):
        if len(running) < seqs and rng.random() < 0.5:
            rid = f"r{step}"
            tokens = [*rng.choice(stems), *[rng.randrange(50) for _ in range(rng.randrange(8))]]
            hit = kv.computed_tokens(rid, tokens)
            n = min(len(tokens), hit + rng.randrange(1, 9))
            full_ok = kv.num_free_blocks >= -(-n // B) - hit // B
            assert kv.allocate(rid, n) == full_ok
            if full_ok:
                kv.cache_blocks(rid, tokens, n)
                running[rid] = tokens[:n]
            else:
                kv.free(rid)
        elif running:
            rid = rng.choice(sorted(running))
            tokens = running.pop(rid)
            if rng.random() < 0.6:
                kv.free(rid)
                continue
            n = len(tokens) + rng.randrange(1, 6)
            tokens += [rng.randrange(50) for _ in range(n - len(tokens))]
            full_ok = kv.num_free_blocks >= -(-n // B) - len(kv.block_ids(rid))
            assert kv.allocate(rid, n) == full_ok
            if full_ok:
                kv.cache_blocks(rid, tokens, n)
                running[rid] = tokens
            else:
                kv.free(rid)
