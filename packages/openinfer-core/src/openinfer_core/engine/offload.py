"""The engine's side of the KV offload tiers (`--kv-offload`).

Saving: after every step, the blocks the step sealed (made findable in the prefix cache) go to
the first tier; the KV manager holds each one until its copy has landed, so a freed block is
never reused, and so never saved under a hash its new contents do not have.

Restoring: when the scheduler admits a request, the blocks after its device prefix hit are
looked up in the tiers. If some are found, fresh device blocks are reserved for them and the
copy starts; the request waits in `loading` while the others are admitted and run. When the
copy lands, the blocks become findable under their hashes and are let go, and the request goes
back to the head of the queue, where its admission finds them as an ordinary prefix hit
(its `cached_tokens` counts them)."""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.sequence import Sequence
from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.kv import OffloadableKV
from openinfer_core.interfaces.model import Model
from openinfer_core.interfaces.offload import (
    RESTORE_BUCKETS,
    BlockStore,
    Lease,
    OffloadContext,
    OffloadStats,
    OffloadTier,
    Transfer,
)
from openinfer_core.plugins import PluginManager

log = logging.getLogger("openinfer")

FINGERPRINT_VERSION = 1  # bump when what a block's bytes mean changes


@dataclass(slots=True, eq=False)
class Loading:
    """A request waiting for its prefix to come back from a tier."""

    seq: Sequence
    lease: Lease
    transfer: Transfer
    held_blocks: int  # device prefix hit, already in its table before the load
    started: float = field(default_factory=time.monotonic)
    aborted: bool = False


def fingerprint(config: EngineConfig, hf_config: dict[str, Any],
                tensors: Iterable[torch.Tensor], rank: int = 0) -> str:
    """16 hex digits naming what a block's bytes depend on: the model (config.json and the
    weight files' names and sizes), the KV dtype and layout, the block size and the rank."""
    model_dir = Path(config.model)
    weights = sorted((p.name, p.stat().st_size) for p in model_dir.glob("*.safetensors"))
    parts = {
        "version": FINGERPRINT_VERSION,
        "config": hf_config,
        "weights": weights if config.load_format != "dummy" else ["dummy", config.seed],
        "kv": [[list(t.shape), str(t.dtype)] for t in tensors],
        "block_size": config.block_size,
        "rank": rank,
    }
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class KVOffload:
    """Owns the first tier. Engine thread only."""

    def __init__(self, tier: OffloadTier, kv: OffloadableKV) -> None:
        self.tier = tier
        self.kv = kv
        kv.track_sealed()
        self._saves: list[tuple[Transfer, list[int]]] = []
        self._loads = 0  # started, not yet finished
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
        if not hasattr(model, "kv_block_tensors") or not isinstance(kv, OffloadableKV):
            raise ModelConfigError(
                "--kv-offload: this model line's KV cache cannot be offloaded (it has no "
                "kv_block_tensors() or its KV manager is not an OffloadableKV)")
        registry = plugins.registries.offload_tiers
        first, *below = config.kv_offload
        for position, name in enumerate(config.kv_offload):
            is_first = registry.get(name).meta.get("first", False)
            if is_first != (position == 0):
                raise ModelConfigError(
                    f"--kv-offload {','.join(config.kv_offload)}: {name!r} can only be "
                    + ("the first tier" if is_first else
                       "below the first tier, which moves blocks to and from the device "
                       "(e.g. --kv-offload host," + name + ")"))
        tensors = model.kv_block_tensors()
        context = OffloadContext(tensors, config.block_size,
                                 fingerprint(config, hf_config, tensors), config)
        stores: list[BlockStore] = [registry.resolve(name)(context) for name in below]
        tier: OffloadTier = registry.resolve(first)(context, stores)
        log.info("KV offload: %s (fingerprint %s)", " -> ".join(config.kv_offload),
                 context.fingerprint)
        return cls(tier, kv)

    # -- saving ----------------------------------------------------------------------------
    def after_step(self) -> None:
        """Save what the last step sealed; let go of blocks whose saves landed."""
        self._reap_saves()
        sealed = self.kv.take_sealed()
        if not sealed:
            return
        hashes = [h for h, _ in sealed]
        ids = [b for _, b in sealed]
        self.kv.hold(ids)
        self._saves.append((self.tier.save(hashes, ids), ids))

    def _reap_saves(self) -> None:
        if not self._saves:
            return
        still = []
        for transfer, ids in self._saves:
            if transfer.poll():
                self.kv.release(ids)
            else:
                still.append((transfer, ids))
        self._saves = still

    # -- restoring -------------------------------------------------------------------------
    def start_load(self, seq: Sequence) -> Loading | None:
        """Called once the request's device prefix hit is attached: look the rest of its
        prefix up and start copying what the tiers have. None (nothing changed) when they
        have nothing, or when too few device blocks are free for it; only the latter leaves
        `seq.offload_probed` unset, so the lookup is tried again at the next admission."""
        rid = seq.request_id
        held = len(self.kv.block_ids(rid))
        hashes = self.kv.prefix_hashes(rid, seq.token_ids)[held:]
        lease = self.tier.query(hashes) if hashes else None
        if lease is None or lease.num_blocks == 0:
            seq.offload_probed = True
            if lease is not None:
                self.tier.release(lease)
            return None
        if not self.kv.reserve(rid, (held + lease.num_blocks) * self.kv.block_size):
            self.tier.release(lease)
            return None
        seq.offload_probed = True  # one restore per request: no thrashing
        targets = list(self.kv.block_ids(rid)[held:held + lease.num_blocks])
        self._loads += 1
        return Loading(seq, lease, self.tier.load(lease, targets), held)

    def finish_load(self, loading: Loading) -> bool:
        """If `loading`'s copy has landed: make its blocks findable, release them and the
        lease, and return True. Never blocks."""
        if not loading.transfer.poll():
            return False
        seq = loading.seq
        self._loads -= 1
        landed = loading.transfer.num_blocks
        self.tier.release(loading.lease)
        self.kv.cache_blocks(seq.request_id, seq.token_ids,
                             (loading.held_blocks + landed) * self.kv.block_size)
        self.kv.free(seq.request_id)
        seconds = time.monotonic() - loading.started
        self._restores += 1
        self._restored_blocks += landed
        self._restore_seconds += seconds
        self._buckets[bisect.bisect_left(RESTORE_BUCKETS, seconds)] += 1
        return True

    # -- the rest --------------------------------------------------------------------------
    def stats(self) -> OffloadStats:
        return OffloadStats(tuple(self.tier.stats()), self._restores, self._restored_blocks,
                            self._restore_seconds, tuple(self._buckets))

    def waiting(self) -> bool:
        """Copies in flight that the engine waits on."""
        return bool(self._saves) or self._loads > 0

    def busy(self) -> bool:
        """Saves still in flight (the engine keeps stepping until they land)."""
        return bool(self._saves)

    def close(self) -> None:
        self.tier.close()
        self._reap_saves()
