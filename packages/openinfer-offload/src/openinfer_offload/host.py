"""The `host` tier: a pinned DRAM pool allocated up front, the first tier under device memory.
Blocks come in as the engine seals them and go back on a prefix hit; beneath it, stores
(`disk`) get every block written through in the background and are read back on a miss."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import torch

from openinfer_core.errors import InvalidParameterError
from openinfer_core.interfaces.offload import BlockStore, Lease, OffloadContext, TierStats
from openinfer_offload.copier import DeviceCopier
from openinfer_offload.host_slots import HostSlots

log = logging.getLogger("openinfer.offload")

IO_THREADS = 4
WRITES_IN_FLIGHT = 4 * IO_THREADS


@dataclass(slots=True)
class _Entry:
    key: int
    slot: int
    store: BlockStore | None  # None: in host memory; else read from this store first


def _wait_for(event: torch.cuda.Event | None) -> None:
    """The current stream waits for `event` (None: a copy that already happened)."""
    if event is not None:
        torch.cuda.current_stream().wait_event(event)


class _Save:
    """Device -> host; on landing its slots become findable and go to the stores."""

    def __init__(self, tier: HostTier, event: torch.cuda.Event | None,
                 entries: list[_Entry], num_blocks: int) -> None:
        self._tier, self._event, self._entries = tier, event, entries
        self._num_blocks = num_blocks
        self._done = False

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    def poll(self) -> bool:
        if not self._done and (self._event is None or self._event.query()):
            self._done = True
            self._tier._saved(self._entries)
        return self._done

    def stream_wait(self) -> bool:
        _wait_for(self._event)
        return True


class _Load:
    """Store -> host (on the I/O threads), then host -> device."""

    def __init__(self, tier: HostTier, entries: list[_Entry], block_ids: Sequence[int]) -> None:
        self._tier, self._entries, self._block_ids = tier, entries, list(block_ids)
        self._reads: list[tuple[int, Future[bool]]] = tier._read(entries)
        self._event: torch.cuda.Event | None = None
        self._copying = False
        self._done = False
        self._num_blocks = 0
        self.poll()  # blocks all in host memory: the copy starts now

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    def poll(self) -> bool:
        if not self._done and self._start_copy():
            self._done = self._event is None or self._event.query()
        return self._done

    def stream_wait(self) -> bool:
        if not self._start_copy():
            return False
        if not self._done:
            _wait_for(self._event)
        return True

    def _start_copy(self) -> bool:
        """Once every store read is done, queue the copy to the device; whether it is queued."""
        if not self._copying:
            if not all(future.done() for _, future in self._reads):
                return False
            self._num_blocks = self._tier._promote(self._entries, self._reads)
            self._event = self._tier._copy_in(self._entries[:self._num_blocks],
                                              self._block_ids[:self._num_blocks])
            self._copying = True
        return True


class HostTier:
    """Registered as `host`; sized by `kv_offload_host_gib`."""

    name = "host"

    def __init__(self, context: OffloadContext, stores: Sequence[BlockStore] = ()) -> None:
        self.block_bytes = context.block_bytes
        gib = context.config.kv_offload_host_gib
        num_slots = int(gib * (1 << 30)) // self.block_bytes
        if num_slots < 1:
            raise InvalidParameterError("kv_offload_host_gib", (
                f"{gib} GiB holds no KV block: one block is "
                f"{self.block_bytes / (1 << 20):.2f} MiB"))
        device = context.block_tensors[0].device
        start = time.monotonic()
        self.pool = torch.empty((num_slots, self.block_bytes), dtype=torch.uint8,
                                pin_memory=device.type == "cuda")
        self.slots = HostSlots(num_slots)
        self.copier = DeviceCopier(context.block_tensors, self.pool, context.staging_bytes)
        self.stores = list(stores)
        self._io = ThreadPoolExecutor(IO_THREADS, "kv-offload-io") if self.stores else None
        self._writes: list[tuple[int, Future[None]]] = []  # slot, write in flight
        self._backlog: deque[int] = deque()  # keys saved here, not yet written below
        self._hits = {tier: 0 for tier in [self.name, *(s.name for s in self.stores)]}
        self._saved_blocks = self._bytes_in = self._bytes_out = 0
        log.info("KV offload host tier: %d blocks (%.1f GiB%s) in %.1f s", num_slots,
                 num_slots * self.block_bytes / (1 << 30),
                 ", pinned" if device.type == "cuda" else "", time.monotonic() - start)

    # -- OffloadTier -------------------------------------------------------------------------
    def save(self, hashes: Sequence[int], block_ids: Sequence[int]) -> _Save:
        self._pump_writes()
        entries: list[_Entry] = []
        ids: list[int] = []
        for key, block in zip(hashes, block_ids, strict=True):
            if (slot := self.slots.find(key)) is not None:
                self.slots.touch(slot)
                continue
            slot = self.slots.take()
            if slot is None:
                break  # every slot is in use: the rest are not saved
            self.slots.index(slot, key)
            entries.append(_Entry(key, slot, None))
            ids.append(block)
        event = self.copier.to_host(ids, [e.slot for e in entries]) if ids else None
        return _Save(self, event, entries, len(entries))

    def query(self, hashes: Sequence[int]) -> Lease:
        self._pump_writes()
        entries: list[_Entry] = []
        for key in hashes:
            if (slot := self.slots.find(key)) is not None:
                self.slots.ref(slot)
                entries.append(_Entry(key, slot, None))
                continue
            store = next((s for s in self.stores if s.contains(key)), None)
            if store is None or (slot := self.slots.take()) is None:
                break
            entries.append(_Entry(key, slot, store))
        return Lease(len(entries), entries)

    def load(self, lease: Lease, block_ids: Sequence[int]) -> _Load:
        if len(block_ids) != lease.num_blocks:
            raise ValueError(f"{len(block_ids)} device blocks for {lease.num_blocks} leased")
        return _Load(self, lease.handle, block_ids)

    def release(self, lease: Lease) -> None:
        for entry in lease.handle:
            self.slots.unref(entry.slot)
        lease.handle = []

    def stats(self) -> list[TierStats]:
        own = TierStats(self.name, self._hits[self.name], self._saved_blocks, self._bytes_in,
                        self._bytes_out, self.slots.num_used, self.slots.num_slots)
        # A store counts its own reads; a hit is a block that reached the device.
        return [own, *(replace(s.stats(), hits=self._hits[s.name]) for s in self.stores)]

    def close(self) -> None:
        self.flush()
        if self._io is not None:
            self._io.shutdown(wait=True)
        for store in self.stores:
            store.close()

    # -- for tests and benchmarks ------------------------------------------------------------
    def flush(self) -> None:
        """Wait until every copy and every write below has landed."""
        self.copier.synchronize()
        while self._backlog or self._writes:
            self._pump_writes()
            if self._writes:
                self._writes[0][1].exception()  # waits for it

    def evict_all(self) -> None:
        """Forget every block no one holds (the stores keep theirs)."""
        self.slots.evict_unreferenced()

    # -- transfers -------------------------------------------------------------------------
    def _saved(self, entries: list[_Entry]) -> None:
        """A save landed: its slots are findable, and go to the stores."""
        self._saved_blocks += len(entries)
        self._bytes_in += len(entries) * self.block_bytes
        for entry in entries:
            self.slots.unref(entry.slot)
        if self._io is not None:
            self._backlog.extend(e.key for e in entries)
            self._pump_writes()

    def _pump_writes(self) -> None:
        """Reap finished writes below; start backlogged ones, at most `WRITES_IN_FLIGHT` at a
        time. A backlogged block that left host memory meanwhile is dropped."""
        if self._io is None:
            return
        still: list[tuple[int, Future[None]]] = []
        for slot, future in self._writes:
            if future.done():
                if (error := future.exception()) is not None:
                    log.warning("writing a KV block below host memory failed: %r", error)
                self.slots.unref(slot)
            else:
                still.append((slot, future))
        self._writes = still
        while self._backlog and len(self._writes) < WRITES_IN_FLIGHT:
            key = self._backlog.popleft()
            found = self.slots.find(key)
            if found is None:  # it left host memory before the stores caught up
                continue
            slot, data = found, self._bytes_of(found)
            for store in self.stores:
                if not store.contains(key):
                    self.slots.ref(slot)
                    self._writes.append((slot, self._io.submit(store.put, key, data)))
                    self._bytes_out += self.block_bytes

    def _bytes_of(self, slot: int) -> memoryview:
        """Slot `slot` of the pool, without a copy."""
        return memoryview(self.pool[slot].numpy())  # type: ignore[arg-type]

    def _read(self, entries: list[_Entry]) -> list[tuple[int, Future[bool]]]:
        reads: list[tuple[int, Future[bool]]] = []
        for i, entry in enumerate(entries):
            if entry.store is not None:
                assert self._io is not None
                out = self._bytes_of(entry.slot)
                reads.append((i, self._io.submit(entry.store.get, entry.key, out)))
        return reads

    def _promote(self, entries: list[_Entry], reads: list[tuple[int, Future[bool]]]) -> int:
        """Blocks read from a store become host entries; returns how many entries, from the
        first, are good (a failed read ends the run)."""
        good = len(entries)
        for i, future in reads:
            entry = entries[i]
            ok = future.exception() is None and future.result()
            if ok and self.slots.index(entry.slot, entry.key):
                self._bytes_in += self.block_bytes
            elif not ok:
                good = min(good, i)
        for entry in entries[:good]:
            self._hits[entry.store.name if entry.store else self.name] += 1
        return good

    def _copy_in(self, entries: list[_Entry], block_ids: list[int]) -> torch.cuda.Event | None:
        self._bytes_out += len(entries) * self.block_bytes
        return self.copier.to_device([e.slot for e in entries], block_ids) if entries else None
