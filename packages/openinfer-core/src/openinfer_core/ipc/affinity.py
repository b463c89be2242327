"""Prefix affinity for data-parallel routing: which replicas served each prompt block lately,
so that a conversation's next turn goes to a replica whose prefix cache holds its KV.

Blocks are keyed like the prefix cache's (openinfer_kvcache.block_hash): a full block's key
chains its parent's key with its token ids, so one key stands for the whole prefix up to it.
The keys must agree across the frontend processes of one server, and Python's tuple hash of
ints does (ints are not salted), at a fraction of blake2b's cost.

The table is a flat array of 8-byte slots in a buffer: a `bytearray` within one frontend, or a
`SharedMemory` segment that every frontend process of the server maps (`SharedAffinity`), so
that a turn that reaches another frontend still finds the replica its first turn went to.
Slots are grouped in sets of `WAYS`; a key belongs in set `key % sets`. A slot packs

    bits 63..16  the key's top 48 bits (its tag; 0 with bits 15..0 all 0: an empty slot)
    bits 15..0   the holders: bit r set if replica r served a prompt with this block

so one aligned 8-byte store writes a slot whole: another process never reads a tag with
half of another key's holders. Within a set the slots are kept newest first: a write moves its
key to the front and the set's last (least recently written) key goes when a new one comes.
Readers and writers take no lock; a lost race (two processes writing one set at once) can
drop an entry or a holder's bit, which costs a prefix-cache miss, never a wrong answer."""

from __future__ import annotations

from collections.abc import Sequence
from multiprocessing import shared_memory

WAYS = 4  # slots per set: a few keys landing on one set do not push each other out
MAX_REPLICAS = 16  # one holder bit each
_KEY = (1 << 64) - 1  # a hash as the unsigned 64 bits a slot holds
_HOLDERS = (1 << MAX_REPLICAS) - 1
_TAG = _KEY ^ _HOLDERS


def block_keys(token_ids: Sequence[int], block_size: int) -> list[int]:
    """One key per full block of `token_ids`, each chained from the previous block's; a
    partial last block gets none (the cache cannot hold it for another request either)."""
    keys: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start:start + block_size])))
        keys.append(parent)
    return keys


def table_bytes(blocks: int) -> int:
    """The size of a table for replicas that can cache `blocks` blocks in all: twice as many
    slots, rounded up to a power of two, so that the keys of blocks still cached somewhere
    seldom push each other out (an older key has most likely left every cache already)."""
    if blocks < 1:
        raise ValueError(f"a prefix table needs >= 1 block, got {blocks}")
    slots = max(WAYS, 1 << (2 * blocks - 1).bit_length())
    return 8 * slots


class PrefixAffinity:
    """The table over `buffer` (its largest power-of-two number of sets of slots; zeroed:
    empty). Any process may read and write it at any time; not locked (see the module
    docstring for what a race costs)."""

    def __init__(self, buffer: bytearray | memoryview) -> None:
        view = memoryview(buffer).cast("B")
        sets = len(view) // (8 * WAYS)
        if sets < 1:
            view.release()
            raise ValueError(f"a prefix table needs >= {8 * WAYS} bytes, got {len(buffer)}")
        sets = 1 << (sets.bit_length() - 1)
        self._bytes = view
        self._slots = view[:8 * WAYS * sets].cast("Q")
        self._set_mask = sets - 1

    @classmethod
    def in_process(cls, blocks: int) -> PrefixAffinity:
        """A table for one frontend, sized for `blocks` (see `table_bytes`)."""
        return cls(bytearray(table_bytes(blocks)))

    @property
    def capacity(self) -> int:
        """How many keys the table holds at most."""
        return len(self._slots)

    def __len__(self) -> int:
        """The keys held now (a scan: for tests and logs, not for routing)."""
        return sum(1 for slot in self._slots if slot)

    def match(self, keys: Sequence[int], replicas: Sequence[int]) -> tuple[int | None, int]:
        """The longest prefix of `keys` that one of `replicas` served, as (the first of
        `replicas`, in their order, that served it; how many blocks it holds); (None, 0)
        without one. Mutates nothing."""
        wanted = 0
        for replica in replicas:
            wanted |= 1 << replica
        slots, set_mask, depth = self._slots, self._set_mask, 0
        for key in keys:
            key &= _KEY
            base = (key & set_mask) * WAYS
            tag = key & _TAG
            for way in range(base, base + WAYS):
                slot = slots[way]
                if slot & _TAG == tag:
                    break
            else:
                break  # a chained key: no deeper one can have been recorded with it
            held = wanted & slot
            if not held:
                break
            wanted, depth = held, depth + 1
        if depth == 0:
            return None, 0
        return next(r for r in replicas if wanted >> r & 1), depth

    def record(self, keys: Sequence[int], replica: int) -> None:
        """`replica` now serves a prompt of `keys`: each key moves to the front of its set with
        the replica's bit added to its holders. Deepest first, so that in a set a prompt's root
        blocks stay longer than its tail, as a prefix cache evicts."""
        if not 0 <= replica < MAX_REPLICAS:
            raise ValueError(f"replica {replica} is not in 0..{MAX_REPLICAS - 1}")
        bit = 1 << replica
        slots, set_mask = self._slots, self._set_mask
        for key in reversed(keys):
            key &= _KEY
            base = (key & set_mask) * WAYS
            tag = key & _TAG
            last = base + WAYS - 1  # absent: the set's oldest slot (or an empty one) goes
            value = tag | bit
            for way in range(base, base + WAYS):
                slot = slots[way]
                if slot & _TAG == tag:
                    last, value = way, slot | bit
                    break
            for way in range(last, base, -1):
                slots[way] = slots[way - 1]
            slots[base] = value

    def close(self) -> None:
        """Let go of the buffer (a shared segment cannot be unmapped while viewed)."""
        self._slots.release()
        self._bytes.release()


class SharedAffinity:
    """A `PrefixAffinity` in a named shared-memory segment, one for every frontend process of
    a server. The launcher `create`s it and `close`s it last, which also removes the name
    (call it on every way out); each frontend `attach`es by name and `close`s, which only
    unmaps. On Linux the segment lives in /dev/shm."""

    def __init__(self, memory: shared_memory.SharedMemory, owner: bool) -> None:
        if memory.buf is None:  # only once closed
            raise ValueError(f"shared memory {memory.name} is closed")
        self._memory = memory
        self._owner = owner
        self.table = PrefixAffinity(memory.buf)

    @classmethod
    def create(cls, blocks: int) -> SharedAffinity:
        """A new, empty segment sized for `blocks` (see `table_bytes`)."""
        return cls(shared_memory.SharedMemory(create=True, size=table_bytes(blocks)), True)

    @classmethod
    def attach(cls, name: str) -> SharedAffinity:
        """The segment `create` made, by its `name`."""
        return cls(shared_memory.SharedMemory(name=name), False)

    @property
    def name(self) -> str:
        return self._memory.name

    def close(self) -> None:
        self.table.close()
        self._memory.close()
        if self._owner:
            self._memory.unlink()
