"""Per-request block tables over a `BlockPool`: the `KVManager` protocol of openinfer-core."""

from __future__ import annotations

from collections.abc import Sequence

from openinfer_kvcache.block_pool import BlockPool


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class PagedKVManager:
    """Each request owns a list of blocks covering its tokens. Engine thread only."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self._tables: dict[str, list[int]] = {}

    @property
    def num_total_blocks(self) -> int:
        return self.pool.num_usable

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_usable - self.pool.num_free

    def computed_tokens(self, request_id: str, token_ids: Sequence[int]) -> int:
        self._tables.setdefault(request_id, [])
        return 0

    def allocate(self, request_id: str, num_tokens: int) -> bool:
        table = self._tables.setdefault(request_id, [])
        missing = blocks_for(num_tokens, self.block_size) - len(table)
        if missing <= 0:
            return True
        if missing > self.pool.num_free:
            return False
        table.extend(self.pool.allocate(missing))
        return True

    def block_ids(self, request_id: str) -> Sequence[int]:
        return self._tables.get(request_id, ())

    def free(self, request_id: str, token_ids: Sequence[int] | None = None) -> None:
        table = self._tables.pop(request_id, None)
        if table:
            self.pool.free(reversed(table))
