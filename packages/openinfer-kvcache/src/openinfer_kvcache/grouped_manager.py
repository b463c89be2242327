"""Per-request block tables in several KV groups, each over its own `BlockPool`, with one
prefix cache across them: the `GroupedKV` protocol of openinfer-core."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from openinfer_core.interfaces.kv import KVGroupSpec, KVGroupUsage, PrefixCacheStats, SealedBlock
from openinfer_kvcache.block_hash import ROOT_PARENT_HASH, iter_block_hashes
from openinfer_kvcache.block_pool import PADDING_BLOCK, BlockPool


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def first_live_block(num_computed_tokens: int, horizon: int, block_size: int) -> int:
    """The first block a window group still needs after `num_computed_tokens`: every later
    token reads positions >= num_computed_tokens - horizon, so a block whose last position is
    below that is never read again."""
    return max(0, num_computed_tokens - horizon) // block_size


class GroupedKVManager:
    """Each request owns one table per group, a token group's indexed by block position. Full
    groups hold every block; a window group's table keeps only the blocks its horizon can
    still read, the rest are the padding block; a state group's table is the request's one
    slot. Blocks found in the prefix cache are shared (reference counted) with the requests
    that computed them, in every group under the same chain hash; a manager with a state group
    has no prefix cache (`GroupedKV`). Engine thread only.

    The first full group is the one `KVManager` callers see: `block_ids`, the block counts
    (which the scheduler's admission and refusal checks read) and `pool`."""

    def __init__(self, groups: Sequence[KVGroupSpec], num_blocks_per_group: Sequence[int],
                 block_size: int, enable_prefix_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if len(groups) != len(num_blocks_per_group):
            raise ValueError(f"{len(groups)} KV groups but {len(num_blocks_per_group)} pool "
                             "sizes")
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            raise ValueError(f"KV group names must differ, got {names}")
        full = [i for i, g in enumerate(groups) if g.is_full]
        if not full:
            raise ValueError(f"KV groups {names}: one must be a full group (horizon None)")
        self.groups = tuple(groups)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pools = tuple(BlockPool(n) for n in num_blocks_per_group)
        self._full = full[0]
        self._windows = [i for i, g in enumerate(groups) if g.is_window]
        self._states = [i for i, g in enumerate(groups) if g.state]
        # Per request, one table per group: the token groups' all the same length, a state
        # group's the request's slot.
        self._tables: dict[str, list[list[int]]] = {}
        # Per request and group: the first block still held; the table's entries before it
        # are the padding block (always 0 in a full group).
        self._live_from: dict[str, list[int]] = {}
        # Hashes of each request's computed full blocks, in table order: the chain goes on
        # from the last one as more blocks fill up.
        self._hashes: dict[str, list[int]] = {}
        # A lookup counts once its request is admitted (its first successful `allocate`), so
        # a request retried while it waits for blocks is not counted every step.
        self._pending_stats: dict[str, tuple[int, int]] = {}
        self._queries = 0
        self._hits = 0
        # Block positions as they become findable, while an offload tier tracks them
        # (`track_sealed`); None: not tracked.
        self._sealed: list[SealedBlock] | None = None

    @property
    def pool(self) -> BlockPool:
        """The first full group's pool."""
        return self.pools[self._full]

    @property
    def num_total_blocks(self) -> int:
        return self.pool.num_usable

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_usable - self.pool.num_free

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self._queries, self._hits)

    def group_usage(self) -> tuple[KVGroupUsage, ...]:
        return tuple(KVGroupUsage(g.name, p.num_usable, p.num_usable - p.num_free, p.num_free,
                                  p.num_cached)
                     for g, p in zip(self.groups, self.pools, strict=True))

    # -- the request's life ------------------------------------------------------------------
    def computed_tokens(self, request_id: str, token_ids: Sequence[int]) -> int:
        tables = self._request(request_id)
        if tables[self._full]:
            raise RuntimeError(f"prefix lookup for request {request_id!r}, which already "
                               f"holds KV blocks {tables[self._full]}")
        if not self.enable_prefix_caching or self._states:
            return 0
        hashes: list[int] = []
        found: list[list[int | None]] = [[] for _ in self.groups]
        # At least one token must be computed: the step needs its logits to sample.
        for i, key in enumerate(iter_block_hashes(token_ids, self.block_size,
                                                  stop=len(token_ids) - 1)):
            blocks = [pool.lookup(key) if g.holds_block(i, self.block_size) else PADDING_BLOCK
                      for g, pool in zip(self.groups, self.pools, strict=True)]
            if any(b is None for b, g in zip(blocks, self.groups, strict=True) if g.is_full):
                break
            hashes.append(key)
            for column, b in zip(found, blocks, strict=True):
                column.append(b)
        num_hit = self._longest_hit(found, len(hashes))
        live = self._live_from[request_id]
        for g, (table, column, pool) in enumerate(zip(tables, found, self.pools, strict=True)):
            live[g] = self._first_live(g, num_hit * self.block_size)
            # `_longest_hit` checked that none of these is None; a periodic group's column
            # has the padding block where it holds none.
            attached = [b for b in column[live[g]:num_hit] if b is not None]
            table.extend([PADDING_BLOCK] * live[g] + attached)
            pool.touch([b for b in attached if b != PADDING_BLOCK])
        self._hashes[request_id] = hashes[:num_hit]
        self._pending_stats[request_id] = (len(token_ids), num_hit * self.block_size)
        return num_hit * self.block_size

    def _longest_hit(self, found: list[list[int | None]], num_full: int) -> int:
        """The most blocks m <= num_full such that every group still has the blocks a step
        after m * block_size tokens reads (`found` holds each group's cached block per chain
        position, None where it is gone; a full group has them all)."""
        for m in range(num_full, 0, -1):
            n = m * self.block_size
            if all(None not in found[g][self._first_live(g, n):m] for g in self._windows):
                return m
        return 0

    def _first_live(self, group: int, num_computed_tokens: int) -> int:
        horizon = self.groups[group].horizon
        if horizon is None:
            return 0
        return first_live_block(num_computed_tokens, horizon, self.block_size)

    def allocate(self, request_id: str, num_tokens: int) -> bool:
        if not self._grow(request_id, num_tokens, windows=True):
            return False
        if (stats := self._pending_stats.pop(request_id, None)) is not None:
            self._queries += stats[0]
            self._hits += stats[1]
        return True

    def _grow(self, request_id: str, num_tokens: int, windows: bool) -> bool:
        """Grow the request's tables to cover `num_tokens`, all or nothing. Every token
        group's table covers the same positions; each new position's KV is written by the
        next step, in every token group, so each needs the same new blocks, except that a
        periodic group takes one only where `holds_block` (padding elsewhere) and, with
        `windows` False, a window group's table grows by padding entries instead. A state
        group needs its one slot, once."""
        tables = self._request(request_id)
        new = range(len(tables[self._full]), blocks_for(num_tokens, self.block_size))
        held = [[g.holds_block(i, self.block_size) for i in new] for g in self.groups]
        need = [(1 if not table else 0) if g.state else sum(h)
                for g, table, h in zip(self.groups, tables, held, strict=True)]
        if not windows:
            for w in self._windows:
                need[w], held[w] = 0, [False] * len(new)
        if any(n > pool.num_free for n, pool in zip(need, self.pools, strict=True)):
            return False
        for g, n, table, pool, h in zip(self.groups, need, tables, self.pools, held,
                                        strict=True):
            if g.state:
                table.extend(pool.allocate(n) if n else [])
                continue
            blocks = iter(pool.allocate(n) if n else [])
            table.extend(next(blocks) if holds else PADDING_BLOCK for holds in h)
        return True

    def cache_blocks(self, request_id: str, token_ids: Sequence[int],
                     num_computed_tokens: int) -> None:
        caching = self.enable_prefix_caching and not self._states
        if not (caching or self._windows):
            return  # nothing to cache or give back
        tables = self._tables.get(request_id)
        num_computed = min(num_computed_tokens, len(token_ids))
        num_full = num_computed // self.block_size
        if tables is None or num_full > len(tables[self._full]):
            held = len(tables[self._full]) if tables else 0
            raise RuntimeError(f"request {request_id!r} has {num_full} computed full blocks "
                               f"but holds {held} KV blocks")
        start = len(self._hashes.get(request_id, ()))
        if caching:
            self._seal(request_id, tables, token_ids, num_full)
        if self._windows:
            self._release_window_blocks(request_id, tables, num_computed)
        if self._sealed is not None and caching:
            self._track(request_id, tables, start)

    def _seal(self, request_id: str, tables: list[list[int]], token_ids: Sequence[int],
              num_full: int) -> None:
        """Make the request's computed full blocks findable, in every group."""
        hashes = self._hashes.setdefault(request_id, [])
        start = len(hashes)
        if num_full <= start:  # most steps: a decode token that fills no block
            return
        size = self.block_size
        new = iter_block_hashes(token_ids, size, stop=num_full * size, start=start,
                                parent_hash=hashes[-1] if hashes else ROOT_PARENT_HASH)
        for i, key in enumerate(new, start):
            hashes.append(key)
            for table, pool in zip(tables, self.pools, strict=True):
                # A window group gives back only blocks sealed first, so table[i] is a block,
                # unless a restore left it padding (it copied in only the window's tail).
                # False when another request cached the same KV first; this copy stays
                # private.
                if table[i] != PADDING_BLOCK:
                    pool.cache(table[i], key)

    def _track(self, request_id: str, tables: list[list[int]], start: int) -> None:
        """Note the positions `_seal` just made findable for the offload tier, each group's
        block where this request's copy is the findable one and it still holds it."""
        assert self._sealed is not None
        hashes = self._hashes[request_id]
        for i in range(start, len(hashes)):
            key = hashes[i]
            blocks = tuple(table[i] if not g.state and table[i] != PADDING_BLOCK
                           and pool.block_hash(table[i]) == key else None
                           for g, table, pool in zip(self.groups, tables, self.pools,
                                                     strict=True))
            if blocks[self._full] is not None:
                self._sealed.append(SealedBlock(key, blocks))

    def _release_window_blocks(self, request_id: str, tables: list[list[int]],
                               num_computed: int) -> None:
        """Give back each window group's blocks that no later step of this request reads.
        A step already launched may still read them: the next step that reuses one runs
        after it on the device, as for `free`."""
        live = self._live_from[request_id]
        for g in self._windows:
            first = self._first_live(g, num_computed)
            if first <= live[g]:
                continue
            table = tables[g]
            gone = [b for b in table[live[g]:first] if b != PADDING_BLOCK]
            table[live[g]:first] = [PADDING_BLOCK] * (first - live[g])
            live[g] = first
            self.pools[g].free(reversed(gone))

    def block_ids(self, request_id: str) -> Sequence[int]:
        tables = self._tables.get(request_id)
        return tables[self._full] if tables is not None else ()

    def group_block_ids(self, request_id: str) -> tuple[Sequence[int], ...]:
        tables = self._tables.get(request_id)
        if tables is None:
            return tuple(() for _ in self.groups)
        return tuple(tables)

    def free(self, request_id: str, token_ids: Sequence[int] | None = None) -> None:
        self._hashes.pop(request_id, None)
        self._pending_stats.pop(request_id, None)
        self._live_from.pop(request_id, None)
        tables = self._tables.pop(request_id, None)
        if tables is None:
            return
        for table, pool in zip(tables, self.pools, strict=True):
            # Tail first, so the start of a prefix stays cached longest.
            pool.free(b for b in reversed(table) if b != PADDING_BLOCK)

    def _request(self, request_id: str) -> list[list[int]]:
        tables = self._tables.get(request_id)
        if tables is None:
            tables = self._tables[request_id] = [[] for _ in self.groups]
            self._live_from[request_id] = [0] * len(self.groups)
        return tables

    # -- offload (interfaces.kv.OffloadableKV) ------------------------------------------------
    def track_sealed(self) -> None:
        if self._sealed is None:
            self._sealed = []

    def take_sealed(self) -> list[SealedBlock]:
        if not self._sealed:
            return []
        sealed, self._sealed = self._sealed, []
        # A block freed since stays findable until reused; one reused since is dropped.
        return [SealedBlock(s.hash, tuple(
                    b if b is not None and pool.block_hash(b) == s.hash else None
                    for b, pool in zip(s.blocks, self.pools, strict=True)))
                for s in sealed if self._still_findable(s)]

    def _still_findable(self, sealed: SealedBlock) -> bool:
        block = sealed.blocks[self._full]
        return block is not None and self.pool.block_hash(block) == sealed.hash

    def prefix_hashes(self, request_id: str, token_ids: Sequence[int]) -> Iterator[int]:
        known = list(self._hashes.get(request_id, ()))
        yield from known
        yield from iter_block_hashes(token_ids, self.block_size, stop=len(token_ids) - 1,
                                     start=len(known),
                                     parent_hash=known[-1] if known else ROOT_PARENT_HASH)

    def reserve(self, request_id: str, num_tokens: int) -> bool:
        lookup = self._pending_stats.pop(request_id, None)
        ok = self._grow(request_id, num_tokens, windows=False)
        if lookup is not None:
            self._pending_stats[request_id] = lookup
        return ok

    def reserve_window_tail(self, request_id: str, num_tokens: int) -> bool:
        tables = self._request(request_id)
        last = blocks_for(num_tokens, self.block_size)
        wanted = {g: [i for i in range(self._first_live(g, num_tokens), last)
                      if tables[g][i] == PADDING_BLOCK] for g in self._windows}
        if any(len(wanted[g]) > self.pools[g].num_free for g in self._windows):
            return False
        for g, positions in wanted.items():
            for i, block in zip(positions, self.pools[g].allocate(len(positions)),
                                strict=True):
                tables[g][i] = block
        return True

    def hold(self, block_ids: Sequence[int], group: int = 0) -> None:
        self.pools[group].touch(block_ids)

    def release(self, block_ids: Sequence[int], group: int = 0) -> None:
        self.pools[group].free(block_ids)
