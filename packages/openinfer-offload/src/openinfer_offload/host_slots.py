"""Which host slot holds which block hash, and which slots may be reused.

A slot is empty, or holds a block under its hash. Its reference count says who needs it now
(a copy in flight, a lease, a write to a store below); a slot with a hash and no references
waits in an LRU and is reused last-recently-used first. Engine thread only."""

from __future__ import annotations

import heapq
from collections import OrderedDict


class HostSlots:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        # A heap: the lowest empty slot is taken first, so a save's slots tend to be
        # consecutive and move in one copy each way.
        self._empty = list(range(num_slots))
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._refs = [0] * num_slots
        self._hash_of: list[int | None] = [None] * num_slots
        self._slot_of: dict[int, int] = {}

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self._empty)

    def find(self, key: int) -> int | None:
        return self._slot_of.get(key)

    def take(self) -> int | None:
        """An unindexed slot with one reference, reusing the least recently used one when none
        is empty; None when every slot is referenced."""
        if self._empty:
            slot = heapq.heappop(self._empty)
        elif self._lru:
            slot = self._forget_oldest()
        else:
            return None
        self._refs[slot] = 1
        return slot

    def index(self, slot: int, key: int) -> bool:
        """Put referenced `slot` under `key`; False when another slot has it already."""
        if key in self._slot_of:
            return False
        self._hash_of[slot] = key
        self._slot_of[key] = slot
        return True

    def ref(self, slot: int) -> None:
        if self._refs[slot] == 0:
            del self._lru[slot]
        self._refs[slot] += 1

    def unref(self, slot: int) -> None:
        self._refs[slot] -= 1
        if self._refs[slot] < 0:
            raise RuntimeError(f"host slot {slot} released more often than taken")
        if self._refs[slot] == 0:
            if self._hash_of[slot] is None:
                heapq.heappush(self._empty, slot)
            else:
                self._lru[slot] = None  # most recently used

    def touch(self, slot: int) -> None:
        """Mark an unreferenced slot as just used."""
        if self._refs[slot] == 0:
            self._lru.move_to_end(slot)

    def evict_unreferenced(self) -> None:
        while self._lru:
            heapq.heappush(self._empty, self._forget_oldest())

    def _forget_oldest(self) -> int:
        slot, _ = self._lru.popitem(last=False)
        del self._slot_of[self._hash_of[slot]]  # type: ignore[arg-type]
        self._hash_of[slot] = None
        return slot

    def num_referenced(self) -> int:
        return sum(1 for r in self._refs if r)
