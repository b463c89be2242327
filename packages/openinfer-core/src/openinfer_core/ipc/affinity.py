"""Prefix affinity for data-parallel routing: which replica last served each prompt block, so
that a conversation's next turn goes to the replica whose prefix cache holds its KV.

Blocks are keyed like the prefix cache's (openinfer_kvcache.block_hash): a full block's key
chains its parent's key with its token ids, so one key stands for the whole prefix up to it.
The keys only need to agree within this process, so Python's own (unsalted for ints) tuple
hash does, at a fraction of blake2b's cost."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence


def block_keys(token_ids: Sequence[int], block_size: int) -> list[int]:
    """One key per full block of `token_ids`, each chained from the previous block's; a
    partial last block gets none (the cache cannot hold it for another request either)."""
    keys: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start:start + block_size])))
        keys.append(parent)
    return keys


class PrefixAffinity:
    """A bounded LRU map from block key to the replica that last served a prompt with that
    block. Not thread-safe: the router uses it from one event loop."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._owner: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owner)

    def match(self, keys: Sequence[int], replicas: Collection[int]) -> tuple[int | None, int]:
        """The replica among `replicas` that last served the longest prefix of `keys`, and how
        many blocks that prefix holds; (None, 0) without one. Mutates nothing."""
        best, matched = None, 0
        for depth, key in enumerate(keys, 1):
            owner = self._owner.get(key)
            if owner is None:
                break  # a chained key: nothing deeper can match either
            if owner in replicas:
                best, matched = owner, depth
        return best, matched

    def record(self, keys: Sequence[int], replica: int) -> None:
        """`replica` now serves the prompt of `keys`. Deepest first, so that the oldest entries
        are a prompt's tails and the shared roots stay longest, as a prefix cache evicts."""
        owner = self._owner
        for key in reversed(keys):
            owner[key] = replica
            owner.move_to_end(key)
        while len(owner) > self.capacity:
            owner.popitem(last=False)
