"""Per-request block tables over a `BlockPool`, with a prefix cache: the `KVManager` protocol of
openinfer-core."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from openinfer_core.interfaces.kv import PrefixCacheStats
from openinfer_kvcache.block_hash import ROOT_PARENT_HASH, iter_block_hashes
from openinfer_kvcache.block_pool import BlockPool


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class PagedKVManager:
    """Each request owns a list of blocks covering its tokens; blocks found in the prefix cache
    are shared (reference counted) with the requests that computed them. Engine thread only."""

    def __init__(self, num_blocks: int, block_size: int,
                 enable_prefix_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self._tables: dict[str, list[int]] = {}
        # Hashes of each request's computed full blocks, in table order: the chain goes on
        # from the last one as more blocks fill up.
        self._hashes: dict[str, list[int]] = {}
        # A lookup counts once its request is admitted (its first successful `allocate`), so
        # a request retried while it waits for blocks is not counted every step.
        self._pending_stats: dict[str, tuple[int, int]] = {}
        self._queries = 0
        self._hits = 0
        self._sealed: list[tuple[int, int]] | None = None  # for offload, once tracked

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

    def computed_tokens(self, request_id: str, token_ids: Sequence[int]) -> int:
        table = self._tables.setdefault(request_id, [])
        if table:
            raise RuntimeError(f"prefix lookup for request {request_id!r}, which already "
                               f"holds KV blocks {table}")
        if not self.enable_prefix_caching:
            return 0
        size = self.block_size
        hashes: list[int] = []
        # At least one token must be computed: the step needs its logits to sample.
        for key in iter_block_hashes(token_ids, size, stop=len(token_ids) - 1):
            block = self.pool.lookup(key)
            if block is None:
                break
            hashes.append(key)
            table.append(block)
        self.pool.touch(table)
        self._hashes[request_id] = hashes
        self._pending_stats[request_id] = (len(token_ids), len(table) * size)
        return len(table) * size

    def allocate(self, request_id: str, num_tokens: int) -> bool:
        table = self._tables.setdefault(request_id, [])
        missing = blocks_for(num_tokens, self.block_size) - len(table)
        if missing > self.pool.num_free:
            return False
        if missing > 0:
            table.extend(self.pool.allocate(missing))
        if (stats := self._pending_stats.pop(request_id, None)) is not None:
            self._queries += stats[0]
            self._hits += stats[1]
        return True

    def cache_blocks(self, request_id: str, token_ids: Sequence[int],
                     num_computed_tokens: int) -> None:
        if not self.enable_prefix_caching:
            return
        table = self._tables.get(request_id)
        num_full = min(num_computed_tokens, len(token_ids)) // self.block_size
        if table is None or num_full > len(table):
            raise RuntimeError(f"request {request_id!r} has {num_full} computed full blocks "
                               f"but holds {len(table or ())} KV blocks")
        hashes = self._hashes.setdefault(request_id, [])
        start = len(hashes)
        if num_full <= start:  # most steps: a decode token that fills no block
            return
        size = self.block_size
        new = iter_block_hashes(token_ids, size, stop=num_full * size, start=start,
                                parent_hash=hashes[-1] if hashes else ROOT_PARENT_HASH)
        for i, key in enumerate(new, start):
            hashes.append(key)
            # False when another request cached the same KV first; this copy stays private.
            if self.pool.cache(table[i], key) and self._sealed is not None:
                self._sealed.append((key, table[i]))

    def block_ids(self, request_id: str) -> Sequence[int]:
        return self._tables.get(request_id, ())

    def free(self, request_id: str, token_ids: Sequence[int] | None = None) -> None:
        self._hashes.pop(request_id, None)
        self._pending_stats.pop(request_id, None)
        table = self._tables.pop(request_id, None)
        if table:
            self.pool.free(reversed(table))

    # -- offload (interfaces.kv.OffloadableKV) ------------------------------------------------
    def track_sealed(self) -> None:
        if self._sealed is None:
            self._sealed = []

    def take_sealed(self) -> list[tuple[int, int]]:
        if not self._sealed:
            return []
        sealed, self._sealed = self._sealed, []
        # A block freed since stays findable until reused; one reused since is dropped.
        return [(h, b) for h, b in sealed if self.pool.block_hash(b) == h]

    def prefix_hashes(self, request_id: str, token_ids: Sequence[int]) -> Iterator[int]:
        known = list(self._hashes.get(request_id, ()))
        yield from known
        yield from iter_block_hashes(token_ids, self.block_size, stop=len(token_ids) - 1,
                                     start=len(known),
                                     parent_hash=known[-1] if known else ROOT_PARENT_HASH)

    def reserve(self, request_id: str, num_tokens: int) -> bool:
        lookup = self._pending_stats.pop(request_id, None)
        ok = self.allocate(request_id, num_tokens)
        if lookup is not None:
            self._pending_stats[request_id] = lookup
        return ok

    def hold(self, block_ids: Sequence[int]) -> None:
        self.pool.touch(block_ids)

    def release(self, block_ids: Sequence[int]) -> None:
        self.pool.free(block_ids)
