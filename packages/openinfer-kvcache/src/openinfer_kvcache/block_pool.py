"""Physical KV blocks: who holds them and which are free."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

PADDING_BLOCK = 0


class BlockPool:
    """Blocks 1..num_blocks-1 with reference counts; block 0 (padding) is never handed out.

    Free blocks are handed out oldest-freed first, so a block just released stays untouched as
    long as possible: the prefix cache (which keeps freed blocks' contents findable by hash)
    then evicts in LRU order by construction. Not thread-safe: the engine thread owns it."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(
                f"a block pool needs at least 2 blocks (one is padding), got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))
        self._ref_count = [0] * num_blocks

    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take `n` free blocks (ref count 1 each). Raises if fewer are free; callers check."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} KV blocks, {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(n)]
        for b in blocks:
            self._ref_count[b] = 1
        return blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref_count[block_id]

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each block; blocks reaching zero join the free queue in the
        given order (callers pass a request's table tail first, so its prefix lasts longest)."""
        for b in blocks:
            if not PADDING_BLOCK < b < self.num_blocks or self._ref_count[b] <= 0:
                raise RuntimeError(f"freeing KV block {b}, which is not allocated")
            self._ref_count[b] -= 1
            if self._ref_count[b] == 0:
                self._free.append(b)
