"""GroupedKVManager under seeded random operations: one full group (and a window group wider
than any request) behaves exactly as PagedKVManager; an engine-like run over window groups
reads back every token's KV it wrote, leaks no block, shares blocks only through the prefix
cache, and never runs a window pool sized by `window_pool_blocks` short."""

from __future__ import annotations

import random

import pytest

from openinfer_core.interfaces.kv import KVGroupSpec
from openinfer_kvcache import PADDING_BLOCK, GroupedKVManager, PagedKVManager
from openinfer_kvcache.grouped_manager import blocks_for, first_live_block
from openinfer_kvcache.manager import FULL_GROUP

B = 4  # block size


def prompt(rng: random.Random) -> list[int]:
    """One of three shared prefixes (for prefix hits), then a few tokens of its own."""
    head = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [1, 2, 3, 4, 20, 21], [30] * 9][rng.randrange(3)]
    return head[:rng.randrange(len(head) + 1)] + [rng.randrange(5) for _ in
                                                 range(rng.randrange(1, 9))]


@pytest.mark.parametrize("enable", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_one_full_group_and_a_wide_window_behave_as_paged(seed: int, enable: bool) -> None:
    rng = random.Random(seed)
    wide = KVGroupSpec("wide", horizon=10**6)
    managers = [PagedKVManager(24, B, enable),
                GroupedKVManager((FULL_GROUP,), (24,), B, enable),
                GroupedKVManager((FULL_GROUP, wide), (24, 24), B, enable)]
    tokens: dict[str, list[int]] = {}
    computed: dict[str, int] = {}
    for step in range(300):
        rid = f"r{rng.randrange(6)}"
        if rid not in tokens:
            tokens[rid] = prompt(rng)
            got = {kv.computed_tokens(rid, tokens[rid]) for kv in managers}
            assert len(got) == 1, step
            computed[rid] = got.pop()
        op = rng.random()
        if op < 0.6:  # a step of 1..6 tokens (new ones are sampled as needed)
            while len(tokens[rid]) < computed[rid] + 6:
                tokens[rid].append(rng.randrange(5))
            num = computed[rid] + rng.randrange(1, 7)
            ok = {kv.allocate(rid, num) for kv in managers}
            assert len(ok) == 1, step
            if ok.pop():
                computed[rid] = num
                for kv in managers:
                    kv.cache_blocks(rid, tokens[rid], num)
        else:
            for kv in managers:
                kv.free(rid, tokens[rid])
            del tokens[rid], computed[rid]
        paged = managers[0]
        for kv in managers[1:]:
            for other in tokens:
                assert list(kv.block_ids(other)) == list(paged.block_ids(other)), step
            assert (kv.num_used_blocks, kv.num_free_blocks, kv.prefix_cache_stats) == (
                paged.num_used_blocks, paged.num_free_blocks, paged.prefix_cache_stats)
            assert kv.pool.free_queue() == paged.pool.free_queue()
        # The wide window's pool lives the same life as the full one.
        for other in tokens:
            full, window = managers[2].group_block_ids(other)
            assert window == full
    assert managers[0].prefix_cache_stats.hits > 0 or not enable


HORIZONS = (5, 12, 0)
MAX_SEQS, BUDGET = 4, 20


def engine_run(seed: int, enable: bool, full_blocks: int) -> GroupedKVManager:
    """Steps as the scheduler takes them (allocate every row, run the step, cache_blocks),
    with window pools of `window_pool_blocks`. The step writes each new token's entry into
    every group and reads back what each new token reads: all earlier positions in the full
    group, its horizon in a window group."""
    from openinfer_kvcache import window_pool_blocks

    rng = random.Random(seed)
    groups = (FULL_GROUP, *(KVGroupSpec(f"w{h}", h) for h in HORIZONS))
    sizes = (full_blocks, *(window_pool_blocks(h, B, MAX_SEQS, BUDGET) for h in HORIZONS))
    kv = GroupedKVManager(groups, sizes, B, enable)
    memory = [[[None] * B for _ in range(n)] for n in sizes]
    waiting = [f"r{i}" for i in range(16)]
    tokens = {rid: prompt(rng) for rid in waiting}
    computed: dict[str, int] = {}
    running: list[str] = []
    finished = 0
    while waiting or running:
        rows: list[tuple[str, int]] = []
        budget = BUDGET
        for rid in list(running):
            n = min(len(tokens[rid]) - computed[rid], budget)
            if n == 0:
                continue
            if not allocate_or_fail(kv, rid, computed[rid] + n):
                kv.free(rid)  # preempted: back to the head of the queue, recomputed
                running.remove(rid)
                waiting.insert(0, rid)
                computed.pop(rid)
                continue
            rows.append((rid, n))
            budget -= n
        while waiting and budget > 0 and len(running) < MAX_SEQS:
            rid = waiting[0]
            hit = kv.computed_tokens(rid, tokens[rid])
            n = min(len(tokens[rid]) - hit, budget)
            if not allocate_or_fail(kv, rid, hit + n):
                kv.free(rid)
                break
            waiting.pop(0)
            running.append(rid)
            computed[rid] = hit
            rows.append((rid, n))
            budget -= n
        for rid, n in rows:
            run_row(kv, memory, tokens[rid], rid, computed[rid], n)
        for rid, n in rows:
            computed[rid] += n
            kv.cache_blocks(rid, tokens[rid], computed[rid])
            if computed[rid] == len(tokens[rid]):  # the step sampled a token
                if len(tokens[rid]) >= 28 or rng.random() < 0.05:
                    kv.free(rid, tokens[rid])
                    running.remove(rid)
                    finished += 1
                else:
                    tokens[rid].append(rng.randrange(5))
        check_tables(kv, {rid: computed[rid] for rid in running})
    assert finished == 16
    assert all(u.used == 0 for u in kv.group_usage())
    return kv


def allocate_or_fail(kv: GroupedKVManager, rid: str, num_tokens: int) -> bool:
    """`allocate`, checking that only the full pool ever refuses."""
    fits = blocks_for(num_tokens, B) - len(kv.block_ids(rid)) <= kv.num_free_blocks
    ok = kv.allocate(rid, num_tokens)
    assert ok == fits, "a window pool refused"
    return ok


def run_row(kv: GroupedKVManager, memory: list[list[list[tuple[int, ...] | None]]],
            tokens: list[int], rid: str, start: int, n: int) -> None:
    tables = kv.group_block_ids(rid)
    for p in range(start, start + n):
        for table, slots in zip(tables, memory, strict=True):
            assert table[p // B] != PADDING_BLOCK
            slots[table[p // B]][p % B] = tuple(tokens[:p + 1])
        for group, table, slots in zip(kv.groups, tables, memory, strict=True):
            first = 0 if group.horizon is None else max(0, p - group.horizon)
            for q in range(first, p + 1):
                assert slots[table[q // B]][q % B] == tuple(tokens[:q + 1]), (rid, p, q)


def check_tables(kv: GroupedKVManager, computed: dict[str, int]) -> None:
    """Reference counts match the live tables, a block in two tables is a cached one, and
    a window table holds exactly the blocks from its first live one on."""
    for g, (group, pool) in enumerate(zip(kv.groups, kv.pools, strict=True)):
        holders: dict[int, int] = {}
        for rid, n in computed.items():
            table = kv.group_block_ids(rid)[g]
            assert len(table) == len(kv.block_ids(rid))
            first = 0 if group.horizon is None else first_live_block(n, group.horizon, B)
            assert all(b == PADDING_BLOCK for b in table[:first])
            assert all(b != PADDING_BLOCK for b in table[first:])
            for b in table[first:]:
                holders[b] = holders.get(b, 0) + 1
        for b, count in holders.items():
            assert pool.ref_count(b) == count
            assert count == 1 or pool.block_hash(b) is not None
        assert kv.group_usage()[g].used == len(holders)


@pytest.mark.parametrize(("enable", "full_blocks"), [(True, 40), (True, 14), (False, 14)])
@pytest.mark.parametrize("seed", range(3))
def test_engine_run_reads_what_it_wrote_and_leaks_nothing(seed: int, enable: bool,
                                                          full_blocks: int) -> None:
    kv = engine_run(seed, enable, full_blocks)
    if enable:
        assert kv.prefix_cache_stats.hits > 0
