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
import hashlib
import itertools
import json
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.request_state import RequestState
from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.capabilities import supports_kv_offload
from openinfer_core.interfaces.kv import OffloadableKV
from openinfer_core.interfaces.model import Model
from openinfer_core.interfaces.offload import (
    RESTORE_BUCKETS,
    BlockStore,
    Loading,
    OffloadContext,
    OffloadStats,
    OffloadTier,
    Transfer,
)
from openinfer_core.plugins import PluginManager

log = logging.getLogger("openinfer")

FINGERPRINT_VERSION = 1  # bump when what a block's bytes mean changes

# Blocks per piece of a restore: a small first piece starts the copy soon; the host hashes and
# looks up the next pieces (microseconds a block) while the copy runs (tens of microseconds).
# The last size repeats.
PIECES = (32, 128, 512)


def fingerprint(config: EngineConfig, hf_config: dict[str, Any],
                tensors: Iterable[torch.Tensor], rank: int = 0) -> str:
    """16 hex digits naming what a block's bytes depend on: the model (config.json and the
    weight files' names and sizes, `--quantization`), the KV dtype and layout, the block size
    and the rank."""
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
    if config.quantization is not None:  # weights quantized at load give other KV bytes
        parts["quantization"] = config.quantization
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class KVOffload:
    """Owns the first tier. Engine thread only."""

    def __init__(self, tier: OffloadTier, kv: OffloadableKV) -> None:
        self.tier = tier
        self.kv = kv
        kv.track_sealed()
        self._saves: list[tuple[Transfer, list[int]]] = []
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
        if not supports_kv_offload(model) or not isinstance(kv, OffloadableKV):
            raise ModelConfigError(
                "--kv-offload: this model line's KV cache cannot be offloaded (the model "
                "lacks capabilities.SupportsKVOffload or its KV manager is not an "
                "OffloadableKV)")
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
        """Save what the last step sealed; let go of blocks whose saves landed and of leases
        whose loads landed."""
        self._reap_saves()
        if self._landing:
            self._reap_loads()
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
            if lease.num_blocks < len(piece):
                break
        seq.offload_probed = True  # one restore per request: no thrashing
        if not loading.pieces:
            return None
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
                             (loading.held_blocks + loading.num_blocks) * self.kv.block_size)
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
            self._loads -= 1
            seconds = time.monotonic() - loading.started
            self._restores += 1
            self._restored_blocks += loading.num_blocks
            self._restore_seconds += seconds
            self._buckets[bisect.bisect_left(RESTORE_BUCKETS, seconds)] += 1
        self._landing = still

    # -- the rest --------------------------------------------------------------------------
    def stats(self) -> OffloadStats:
        return OffloadStats(tuple(self.tier.stats()), self._restores, self._restored_blocks,
                            self._restore_seconds, tuple(self._buckets))

    def waiting(self) -> bool:
        """Copies in flight that the engine waits on."""
        return bool(self._saves) or self._loads > 0

    def busy(self) -> bool:
        """Saves, or loads already handed back, still in flight (the engine keeps stepping
        until they land)."""
        return bool(self._saves or self._landing)

    def close(self) -> None:
        self.tier.close()
        self._reap_saves()
        self._reap_loads()
