"""The engine's side of the KV offload tiers (`--kv-offload`).

Saving: after every step, the blocks the step sealed (made findable in the prefix cache) go to
the first tier; the KV manager holds each one until its copy has landed, so a freed block is
never reused, and so never saved under a hash its new contents do not have.

Restoring: when the scheduler admits a request, the blocks after its device prefix hit are
looked up in the tiers. If some are found, fresh device blocks are reserved for them and the
copy starts; the request waits in `loading` while the others are admitted and run. When the
copy lands (or, for a request that is alone, as soon as it is queued on the device, the
compute stream waiting for it), the blocks become findable under their hashes and are let go,
and the request goes back to the head of the queue, where its admission finds them as an
ordinary prefix hit (its `cached_tokens` counts them)."""

from __future__ import annotations

import bisect
import itertools
import logging
import time
from typing import Any

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.offload_tiers import build_tiers, fingerprint, merged_stats
from openinfer_core.engine.request_state import RequestState
from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.kv import GroupedKV, OffloadableKV
from openinfer_core.interfaces.model import Model
from openinfer_core.interfaces.offload import (
    RESTORE_BUCKETS,
    Lease,
    Loading,
    OffloadStats,
    OffloadTier,
    Transfer,
)
from openinfer_core.plugins import PluginManager

__all__ = ["PIECES", "KVOffload", "fingerprint"]

log = logging.getLogger("openinfer")

# Blocks per piece of a restore: a small first piece starts the copy soon; the host hashes and
# looks up the next pieces (microseconds a block) while the copy runs (tens of microseconds).
# The last size repeats.
PIECES = (32, 128, 512)


class KVOffload:
    """Owns the first tier of each copied KV group (`offload_tiers`): `tier`, the first full
    group's, drives a restore; a window group's restores the tail the full group's run ends
    on. Engine thread only."""

    def __init__(self, tiers: dict[int, OffloadTier], kv: OffloadableKV) -> None:
        self.tiers = tiers
        self.kv = kv
        groups = kv.groups if isinstance(kv, GroupedKV) else ()
        self.group = next((g for g in tiers if not groups or groups[g].is_full), 0)
        self.tier = tiers[self.group]
        # (group, horizon) of the window groups a restore copies a tail of
        self._windows = [(g, h) for g in tiers if groups and (h := groups[g].horizon) is not None]
        # The full groups beyond the first, restored beside it (`_start_extras`)
        self._extras = [g for g in tiers if groups and groups[g].is_full and g != self.group]
        self._groups = groups
        kv.track_sealed()
        self._saves: list[tuple[Transfer, int, list[int]]] = []
        self._loads = 0  # started, not yet landed
        self._landing: list[Loading] = []  # handed back to the scheduler, not yet landed
        self._restores = 0
        self._restored_blocks = 0
        self._restore_seconds = 0.0
        self._buckets = [0] * (len(RESTORE_BUCKETS) + 1)

    @classmethod
    def build(cls, config: EngineConfig, plugins: PluginManager, model: Model, kv: Any,
              hf_config: dict[str, Any]) -> KVOffload | None:
        """The tiers `config.kv_offload` names, chained; None when it names none."""
        if not config.kv_offload:
            return None
        if not isinstance(kv, OffloadableKV):
            raise ModelConfigError(
                "--kv-offload: this model line's KV cache cannot be offloaded (its KV manager "
                "is not an OffloadableKV)")
        return cls(build_tiers(config, plugins, model, kv, hf_config), kv)

    # -- saving ----------------------------------------------------------------------------
    def after_step(self) -> None:
        """Save what the last step sealed; let go of blocks whose saves landed and of leases
        whose loads landed."""
        self._reap_saves()
        if self._landing:
            self._reap_loads()
        sealed = self.kv.take_sealed()
        if not sealed:
            return
        for g, tier in self.tiers.items():
            saved = [(s.hash, b) for s in sealed if (b := s.blocks[g]) is not None]
            if saved:
                ids = [b for _, b in saved]
                self.kv.hold(ids, g)
                self._saves.append((tier.save([h for h, _ in saved], ids), g, ids))

    def _reap_saves(self) -> None:
        if not self._saves:
            return
        still = []
        for transfer, g, ids in self._saves:
            if transfer.poll():
                self.kv.release(ids, g)
            else:
                still.append((transfer, g, ids))
        self._saves = still

    # -- restoring -------------------------------------------------------------------------
    def start_load(self, seq: RequestState) -> Loading | None:
        """Called once the request's device prefix hit is attached: look the rest of its
        prefix up and start copying what the tiers have, a piece at a time (`PIECES`). None
        (nothing changed) when they have nothing, or when too few device blocks are free;
        only the latter leaves `seq.offload_probed` unset, so the lookup is tried again at the
        next admission."""
        rid = seq.request_id
        held = len(self.kv.block_ids(rid))
        hashes = itertools.islice(self.kv.prefix_hashes(rid, seq.token_ids), held, None)
        loading = Loading(seq, held)
        found = held
        seen: list[int] = []  # the hashes of blocks held..found
        whole = (len(seq.token_ids) - 1) // self.kv.block_size  # blocks a hit may cover
        for size in itertools.chain(PIECES, itertools.repeat(PIECES[-1])):
            piece = list(itertools.islice(hashes, size))
            lease = self.tier.query(piece) if piece else None
            if lease is None or lease.num_blocks == 0:
                if lease is not None:
                    self.tier.release(lease)
                break
            if not loading.pieces:
                # Device blocks are taken once, before the first copy: for the run found if
                # the first piece ended it, else for the whole prefix (what later pieces find
                # is not known yet). A restore waits for all its blocks or never runs short.
                need = found + lease.num_blocks if lease.num_blocks < len(piece) else whole
                if not self.kv.reserve(rid, need * self.kv.block_size):
                    self.tier.release(lease)
                    return None
            targets = list(self.kv.block_ids(rid)[found:found + lease.num_blocks])
            loading.pieces.append((lease, self.tier.load(lease, targets)))
            found += lease.num_blocks
            seen += piece[:lease.num_blocks]
            if lease.num_blocks < len(piece):
                break
        seq.offload_probed = True  # one restore per request: no thrashing
        if not loading.pieces:
            return None
        if self._extras:
            seen = self._start_extras(loading, seen)
        if self._windows:
            self._start_tails(loading, seen)
        self._loads += 1
        return loading

    def finish_load(self, loading: Loading, chain: bool) -> bool:
        """If `loading`'s blocks are ready for the next step, make them findable, let them go
        and return True. Ready means landed, or, with `chain`, queued on the device ahead of
        every later step: the compute stream waits for the copy instead of the engine thread,
        so the request's step is launched while its KV is still on its way (every step after
        it waits too, so the scheduler chains only a request that is alone). The leases are
        released once the copies land (`after_step`). Never blocks."""
        if not loading.ready(chain):
            return False
        seq = loading.seq
        self.kv.cache_blocks(seq.request_id, seq.token_ids,
                             self._restored_end(loading) * self.kv.block_size)
        self.kv.free(seq.request_id)
        self._landing.append(loading)
        return True

    def _reap_loads(self) -> None:
        """Release the leases of loads whose copies landed; count the restores."""
        still: list[Loading] = []
        for loading in self._landing:
            if not loading.landed():
                still.append(loading)
                continue
            for lease, _ in loading.pieces:
                self.tier.release(lease)
            for g, _, lease, _ in loading.tails:
                self.tiers[g].release(lease)
            for g, _, lease, _ in loading.extras:
                self.tiers[g].release(lease)
            self._loads -= 1
            seconds = time.monotonic() - loading.started
            self._restores += 1
            self._restored_blocks += self._restored_end(loading) - loading.held_blocks
            self._restore_seconds += seconds
            self._buckets[bisect.bisect_left(RESTORE_BUCKETS, seconds)] += 1
        self._landing = still

    def _start_extras(self, loading: Loading, hashes: list[int]) -> list[int]:
        """Each full group beyond the first copies back its blocks of the run found, at the
        positions where it holds one (`KVGroupSpec.holds_block`; `reserve` took them with the
        first group's). Where its tier lacks one, the run is cut back to that position (and
        `loading.end` with it): the hashes of the run kept."""
        held, size = loading.held_blocks, self.kv.block_size
        end = held + len(hashes)
        tables = self.kv.group_block_ids(loading.seq.request_id) if isinstance(
            self.kv, GroupedKV) else ()
        for g in self._extras:
            positions = [i for i in range(held, end) if self._groups[g].holds_block(i, size)]
            if not positions:
                continue
            lease = self.tiers[g].query([hashes[i - held] for i in positions])
            kept = positions[:lease.num_blocks]
            if len(kept) < len(positions):
                end = positions[len(kept)]
            loading.extras.append(
                (g, kept, lease, self.tiers[g].load(lease, [tables[g][i] for i in kept])))
        loading.end = end if loading.end is None else min(loading.end, end)
        return hashes[:end - held]

    def _start_tails(self, loading: Loading, hashes: list[int]) -> None:
        """The window tail rule for a restore whose full-group run ends at block `end`: each
        window group needs its blocks [end - horizon, end) (in tokens) from the tiers, except
        those the device hit already attached. Where a tier lacks some, `end` moves back to
        the missing block and the lookup is tried again; the tails found are reserved and
        copied, and `loading.end` caps what the restore makes findable."""
        held, size = loading.held_blocks, self.kv.block_size
        end = held + len(hashes)
        leases = self._lease_tails(held, end, hashes)
        while isinstance(leases, int):
            end = leases
            leases = self._lease_tails(held, end, hashes)
        rid = loading.seq.request_id
        if end > held and not self.kv.reserve_window_tail(rid, end * size):
            for g, _, lease in leases:
                self.tiers[g].release(lease)
            leases, end = [], held
        tables = self.kv.group_block_ids(rid) if isinstance(self.kv, GroupedKV) else ()
        for g, first, lease in leases:
            targets = list(tables[g][first:end])
            loading.tails.append((g, first, lease, self.tiers[g].load(lease, targets)))
        loading.end = end if loading.end is None else min(loading.end, end)

    def _lease_tails(self, held: int, end: int,
                     hashes: list[int]) -> list[tuple[int, int, Lease]] | int:
        """Lease each window group's tail for a restore ending at block `end`: the leases
        (group, first block, lease), or, where a tier lacks a block, the block it lacks first
        (every lease released)."""
        leases: list[tuple[int, int, Lease]] = []
        short = end
        for g, horizon in self._windows:
            first = max(held, max(0, end * self.kv.block_size - horizon) // self.kv.block_size)
            piece = hashes[first - held:end - held]
            if end > held and piece:
                lease = self.tiers[g].query(piece)
                leases.append((g, first, lease))
                short = min(short, first + lease.num_blocks)
        if short == end:
            return leases
        for g, _, lease in leases:
            self.tiers[g].release(lease)
        return short

    def _restored_end(self, loading: Loading) -> int:
        """Blocks, from the first, that a landed restore makes findable: its full-group run,
        capped by the window tail rule (`loading.end`) and by a window tail that came back
        short (the blocks after it hold no KV)."""
        end = loading.held_blocks + loading.num_blocks
        if loading.end is not None:
            end = min(end, loading.end)
        for _, first, _, transfer in loading.tails:
            end = min(end, first + transfer.num_blocks)
        for _, positions, _, transfer in loading.extras:
            if transfer.num_blocks < len(positions):
                end = min(end, positions[transfer.num_blocks])
        return end

    # -- the rest --------------------------------------------------------------------------
    def stats(self) -> OffloadStats:
        return OffloadStats(merged_stats(list(self.tiers.values())), self._restores,
                            self._restored_blocks, self._restore_seconds, tuple(self._buckets))

    def waiting(self) -> bool:
        """Copies in flight that the engine waits on."""
        return bool(self._saves) or self._loads > 0

    def busy(self) -> bool:
        """Saves, or loads already handed back, still in flight (the engine keeps stepping
        until they land)."""
        return bool(self._saves or self._landing)

    def close(self) -> None:
        for tier in self.tiers.values():
            tier.close()
        self._reap_saves()
        self._reap_loads()
