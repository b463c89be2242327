"""Physical KV blocks: who holds them, which are free, and which full blocks are findable by
their prefix hash."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

PADDING_BLOCK = 0


class BlockPool:
    """Blocks 1..num_blocks-1 with reference counts; block 0 (padding) is never handed out.

    A free block (reference count 0) waits in a queue and is handed out oldest-freed first. A
    free block may still carry a prefix hash: its KV stays findable (`lookup`) until the block
    is handed out again, which evicts the hash. The queue is therefore the prefix cache's LRU,
    and `touch` takes a free cached block back out of it. Not thread-safe: the engine thread
    owns it."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(
                f"a block pool needs at least 2 blocks (one is padding), got {num_blocks}")
        self.num_blocks = num_blocks
        # Insertion order is the LRU order; O(1) removal from the middle for `touch`.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self._ref_count = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._block_of: dict[int, int] = {}  # prefix hash -> the block holding that KV
        self.num_evictions = 0  # cached blocks whose hash was dropped to reuse them

    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        """Blocks no request holds, cached ones (evictable) included."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks that carry a prefix hash, held or free."""
        return len(self._block_of)

    def free_queue(self) -> list[int]:
        """The free blocks, next to be handed out first. Pure; for tests and debugging."""
        return list(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take `n` free blocks (ref count 1 each), evicting the hashes they carry. Raises if
        fewer are free; callers check."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} KV blocks, {len(self._free)} free")
        blocks = [self._free.popitem(last=False)[0] for _ in range(n)]
        for b in blocks:
            self._ref_count[b] = 1
            h = self._hash_of[b]
            if h is not None:
                self._hash_of[b] = None
                del self._block_of[h]
                self.num_evictions += 1
        return blocks

    def touch(self, blocks: Iterable[int]) -> None:
        """Add one reference to each cached block (a prefix hit); a free one leaves the queue."""
        for b in blocks:
            if self._hash_of[b] is None:
                raise RuntimeError(f"touching KV block {b}, which is not cached")
            if self._ref_count[b] == 0:
                del self._free[b]
            self._ref_count[b] += 1

    def ref_count(self, block_id: int) -> int:
        return self._ref_count[block_id]

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each block; blocks reaching zero join the free queue in the
        given order (callers pass a request's table tail first, so its prefix lasts longest).
        Cached blocks keep their hash."""
        for b in blocks:
            if not PADDING_BLOCK < b < self.num_blocks or self._ref_count[b] <= 0:
                raise RuntimeError(f"freeing KV block {b}, which is not allocated")
            self._ref_count[b] -= 1
            if self._ref_count[b] == 0:
                self._free[b] = None

    # -- prefix hashes ---------------------------------------------------------------------
    def cache(self, block_id: int, block_hash: int) -> bool:
        """Make held block `block_id` findable under `block_hash`. False (and nothing changes)
        when another block already holds that KV: the first copy stays the cached one."""
        if self._ref_count[block_id] <= 0:
            raise RuntimeError(f"caching KV block {block_id}, which is not allocated")
        current = self._hash_of[block_id]
        if current is not None:
            if current != block_hash:
                raise RuntimeError(f"KV block {block_id} is cached under another hash")
            return True
        if block_hash in self._block_of:
            return False
        self._hash_of[block_id] = block_hash
        self._block_of[block_hash] = block_id
        return True

    def lookup(self, block_hash: int) -> int | None:
        """The block holding the KV of `block_hash`, held or free, if any. Pure."""
        return self._block_of.get(block_hash)

    def block_hash(self, block_id: int) -> int | None:
        """The hash `block_id` is cached under, if any. Pure."""
        return self._hash_of[block_id]
