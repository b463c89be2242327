"""Per-request block tables over one `BlockPool`, with a prefix cache that offload tiers can
save and restore: the `KVManager` and `OffloadableKV` protocols of openinfer-core."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from openinfer_core.interfaces.kv import KVGroupSpec
from openinfer_kvcache.block_hash import ROOT_PARENT_HASH, iter_block_hashes
from openinfer_kvcache.grouped_manager import GroupedKVManager, blocks_for

__all__ = ["FULL_GROUP", "PagedKVManager", "blocks_for"]

FULL_GROUP = KVGroupSpec("full")


class PagedKVManager(GroupedKVManager):
    """The one-group case of `GroupedKVManager`: each request owns a list of blocks covering
    its tokens; blocks found in the prefix cache are shared (reference counted) with the
    requests that computed them. Its blocks can be saved to and restored from offload tiers
    (a manager with window groups cannot yet: see the package README). Engine thread only."""

    def __init__(self, num_blocks: int, block_size: int,
                 enable_prefix_caching: bool = True) -> None:
        super().__init__((FULL_GROUP,), (num_blocks,), block_size, enable_prefix_caching)

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
