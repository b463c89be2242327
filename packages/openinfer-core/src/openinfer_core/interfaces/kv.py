"""The KV block manager: which device blocks hold which request's keys and values."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class KVManager(Protocol):
    """Logical bookkeeping of a paged KV cache. Block 0 is reserved (padding) and never handed
    out. Called only from the engine thread; every method may mutate state unless it says not.

    The prefix cache plugs in behind `computed_tokens` and `free` without changing callers."""

    block_size: int

    @property
    def num_total_blocks(self) -> int:
        """Blocks a request can ever use (the padding block excluded). Pure."""
        ...

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now. Pure."""
        ...

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by requests. Pure."""
        ...

    def computed_tokens(self, request_id: str, token_ids: Sequence[int]) -> int:
        """Tokens of `token_ids` whose KV this request can reuse from the cache (0 without a
        prefix cache). Attaches the reused blocks to the request."""
        ...

    def allocate(self, request_id: str, num_tokens: int) -> bool:
        """Grow the request's blocks to cover `num_tokens` tokens. All or nothing: returns False
        and changes nothing when not enough blocks are free."""
        ...

    def block_ids(self, request_id: str) -> Sequence[int]:
        """The request's block table, in order. Pure."""
        ...

    def free(self, request_id: str, token_ids: Sequence[int] | None = None) -> None:
        """Release every block of the request (unknown ids are ignored). `token_ids`, when
        given, lets a prefix cache keep full blocks reusable."""
        ...
