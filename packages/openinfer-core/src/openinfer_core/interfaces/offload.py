"""KV offload tiers below device memory (host DRAM, disk), keyed by prefix-cache block hash.

Tiers are chained in `--kv-offload` order. The first (`host` built in) moves blocks between
device memory and itself; it is an `OffloadTier`, the only tier the engine talks to. Each later
one is a `BlockStore` beneath it: the first tier writes blocks through to the stores in the
background and reads a block back from them when it holds it no longer.

Keys are the prefix cache's chained block hashes (`openinfer_kvcache.hash_block`), valid only
within one `fingerprint`: a store that outlives the process keeps entries of other models or
layouts apart by it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # the API process reads `OffloadStats` without importing torch
    import torch

    from openinfer_core.engine.config import EngineConfig
    from openinfer_core.engine.request_state import RequestState

# Device memory the first tier may take for itself (a staging buffer); the KV cache is sized
# without it.
OFFLOAD_DEVICE_BYTES = 256 << 20

# Upper bounds (seconds) of the restore-latency histogram in `OffloadStats`.
RESTORE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class OffloadContext:
    """What a tier is built with. `block_tensors` are the device KV tensors of one KV group:
    dim 0 is the block id, and block b's KV is `t[b]` of every tensor (a model's
    `kv_block_tensors()`, or one group's of `kv_group_block_tensors()`: a model with window
    groups gets a chain of tiers per group, each with its share of the configured sizes in
    `config`). A tier reads its own options from `config` (`kv_offload_host_gib`, ...)."""

    block_tensors: Sequence[torch.Tensor]
    block_size: int  # tokens per block
    fingerprint: str  # model, dtype, KV layout, group, block size and rank, as short hex
    config: EngineConfig
    staging_bytes: int = OFFLOAD_DEVICE_BYTES  # device memory the first tier may take

    @property
    def block_bytes(self) -> int:
        """Bytes of one block over every tensor."""
        return sum(t[0].numel() * t.element_size() for t in self.block_tensors)


@dataclass(frozen=True, slots=True)
class TierStats:
    """Running totals of one tier, in blocks and bytes: `hits` blocks were restored from it,
    `saved` written to it, `bytes_in` / `bytes_out` moved into / out of it. `disabled`: the
    tier turned itself off after an I/O error (a full or failing disk) and serves nothing."""

    name: str
    hits: int = 0
    saved: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    used_blocks: int = 0
    capacity_blocks: int = 0
    disabled: bool = False


@dataclass(frozen=True, slots=True)
class OffloadStats:
    """Engine totals for metrics: per tier, then restores (requests whose prefix came back
    from a tier), the blocks they brought, and how long they took: the total and a histogram
    over `RESTORE_BUCKETS` (one count per bucket, the last for slower ones)."""

    tiers: tuple[TierStats, ...] = ()
    restores: int = 0
    restored_blocks: int = 0
    restore_seconds: float = 0.0
    restore_buckets: tuple[int, ...] = (0,) * (len(RESTORE_BUCKETS) + 1)


@dataclass(slots=True)
class Lease:
    """What `query` found: the first `num_blocks` of the hashes asked for, held by the tier
    (never evicted) until `release`. `handle` is the tier's own."""

    num_blocks: int
    handle: Any = field(default=None, repr=False)


@runtime_checkable
class Transfer(Protocol):
    """A copy in flight."""

    def poll(self) -> bool:
        """True once the copy has landed (then stays True). Never blocks."""
        ...

    def stream_wait(self) -> bool:
        """If all that is left of the copy is queued on a device stream, make the current
        stream wait for it and return True: work queued on the current stream from then on
        sees the copied blocks, though `poll()` may still be False. False while the copy
        waits on the host (a store's read). Never blocks the host."""
        ...

    @property
    def num_blocks(self) -> int:
        """Blocks that land, from the first; read it once `poll()` or `stream_wait()` is
        True. A load may land fewer than it was asked for (a store's copy turned out
        corrupt): the rest are a miss."""
        ...


@runtime_checkable
class OffloadTier(Protocol):
    """The first tier: exchanges blocks with device memory. Built as `cls(context, stores)`
    (`stores`: the `BlockStore`s beneath it, in order). Engine thread only."""

    name: str

    def save(self, hashes: Sequence[int], block_ids: Sequence[int]) -> Transfer:
        """Copy device blocks `block_ids` out under `hashes` (blocks the tier already holds
        are skipped; blocks it has no room for are dropped). Ordered after the work already
        queued on the current device stream, so it sees KV the step just wrote. The caller
        keeps the source blocks from reuse until the transfer lands."""
        ...

    def query(self, hashes: Sequence[int]) -> Lease:
        """The longest run of `hashes`, from the first, that this tier or a store beneath it
        holds, leased. Never blocks on I/O."""
        ...

    def load(self, lease: Lease, block_ids: Sequence[int]) -> Transfer:
        """Start copying the leased blocks into device blocks `block_ids` (one per leased
        block). The caller keeps the target blocks from every reader until it lands."""
        ...

    def release(self, lease: Lease) -> None:
        """End a lease (after its load landed, or instead of loading)."""
        ...

    def stats(self) -> Sequence[TierStats]:
        """This tier's totals, then each store's. Pure."""
        ...

    def close(self) -> None:
        """Finish the copies and writes in flight, then let go of memory and files."""
        ...


@runtime_checkable
class BlockStore(Protocol):
    """A tier beneath the first, fed from and read into host memory. Built as `cls(context)`.
    `put` and `get` run on the first tier's I/O threads (possibly several at once);
    `contains` on the engine thread, so it must not touch the disk or network."""

    name: str

    def contains(self, key: int) -> bool:
        """Whether `get(key)` is likely to succeed."""
        ...

    def put(self, key: int, data: memoryview) -> None:
        """Store one block. A failure (disk full, read-only) is logged and dropped, never
        raised: the block is simply not there later."""
        ...

    def get(self, key: int, out: memoryview) -> bool:
        """Read one block into `out`; False on a miss or a copy that fails its checksum
        (which is dropped)."""
        ...

    def stats(self) -> TierStats: ...

    def close(self) -> None: ...


@dataclass(slots=True, eq=False)
class Loading:
    """A request waiting for its prefix to come back from a tier, in pieces (leased and
    copied one after another, so the first copy starts before the whole prompt is hashed)."""

    seq: RequestState
    held_blocks: int  # device prefix hit, already in its table before the load
    pieces: list[tuple[Lease, Transfer]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    aborted: bool = False
    # With window KV groups: each one's tail, copied once the full group's pieces are found,
    # as (group, first block position, lease, transfer); `end` caps the blocks the restore
    # may make findable (the window tail rule: `GroupedKV`). None: no window groups.
    tails: list[tuple[int, int, Lease, Transfer]] = field(default_factory=list)
    end: int | None = None
    # Full groups beyond the first (a periodic one holds only some blocks): each one's blocks
    # of the run found, as (group, their positions, lease, transfer).
    extras: list[tuple[int, list[int], Lease, Transfer]] = field(default_factory=list)

    def transfers(self) -> list[Transfer]:
        return ([t for _, t in self.pieces] + [t for *_, t in self.tails]
                + [t for *_, t in self.extras])

    def ready(self, chain: bool) -> bool:
        """Every piece landed, or, with `chain`, queued ahead of the compute stream's next
        work (`Transfer.stream_wait`)."""
        return self.landed() or (chain and all(t.stream_wait() for t in self.transfers()))

    def landed(self) -> bool:
        return all(t.poll() for t in self.transfers())

    @property
    def num_blocks(self) -> int:
        """Blocks restored, from the first: up to the first piece that came back short."""
        total = 0
        for lease, transfer in self.pieces:
            total += transfer.num_blocks
            if transfer.num_blocks < lease.num_blocks:
                break
        return total


@runtime_checkable
class PrefixRestorer(Protocol):
    """What a scheduler with `capabilities.SupportsOffload` is handed: the engine's side of the
    first tier (`engine.offload.KVOffload`). Engine thread only; never blocks."""

    def start_load(self, seq: RequestState) -> Loading | None:
        """At admission, once `seq`'s device prefix hit is attached: start copying the rest of
        its prefix back from the tiers. None when they hold nothing more (or too few device
        blocks are free: then it is tried again at the next admission)."""
        ...

    def finish_load(self, loading: Loading, chain: bool) -> bool:
        """Whether `loading` is ready for the next step; if so its blocks are now findable as a
        plain prefix hit (and no longer held by the request). With `chain`, a copy queued ahead
        of the compute stream counts as ready (the scheduler chains only a request that is
        alone)."""
        ...

    def stats(self) -> OffloadStats: ...
