"""Building the offload tiers `--kv-offload` names, one chain per KV group the tiers copy.

A model with one block table gets one chain over `kv_block_tensors()`. A model with window KV
groups gets a chain per full and window group over that group's `kv_group_block_tensors()`:
each saves and restores its own group's blocks under the block hash, so every tier's byte and
block counts stay exact per group. The configured sizes (`kv_offload_host_gib`,
`kv_offload_disk_gib`) and the device staging are shared out in proportion to the groups'
device pools, and each group's fingerprint names the group (its disk files live apart)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from openinfer_core.engine.config import EngineConfig
from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.capabilities import (
    kv_groups_of,
    supports_kv_group_offload,
    supports_kv_offload,
)
from openinfer_core.interfaces.kv import GroupedKV, OffloadableKV
from openinfer_core.interfaces.model import Model
from openinfer_core.interfaces.offload import (
    OFFLOAD_DEVICE_BYTES,
    BlockStore,
    OffloadContext,
    OffloadTier,
    TierStats,
)
from openinfer_core.plugins import PluginManager

log = logging.getLogger("openinfer")

FINGERPRINT_VERSION = 1  # bump when what a block's bytes mean changes


def fingerprint(config: EngineConfig, hf_config: dict[str, Any],
                tensors: Iterable[torch.Tensor], rank: int = 0, group: str | None = None) -> str:
    """16 hex digits naming what a block's bytes depend on: the model (config.json and the
    weight files' names and sizes, `--quantization`), the KV dtype and layout, the KV group
    (None: the one block table), the block size and the rank."""
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
    if group is not None:
        parts["group"] = group
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def group_tensors(model: Model, kv: OffloadableKV) -> dict[int, list[torch.Tensor]]:
    """The tensors each copied group's tier chain moves, by group index (0 for one table).
    Raises `ModelConfigError` where the model or its KV manager cannot be offloaded."""
    groups = kv_groups_of(model)
    if not any(g.is_window for g in groups):
        if not supports_kv_offload(model):
            raise ModelConfigError(
                "--kv-offload: this model line's KV cache cannot be offloaded (the model "
                "lacks capabilities.SupportsKVOffload)")
        full = next((i for i, g in enumerate(groups) if g.is_full), 0)
        return {full: model.kv_block_tensors()}
    if not supports_kv_group_offload(model) or not isinstance(kv, GroupedKV):
        raise ModelConfigError(
            "--kv-offload: this model line keeps KV in window groups but cannot offload them "
            "(the model lacks capabilities.SupportsKVGroupOffload or its KV manager is not a "
            "GroupedKV)")
    per_group = model.kv_group_block_tensors()
    return {i: list(per_group[i]) for i, g in enumerate(groups) if not g.state and per_group[i]}


def build_tiers(config: EngineConfig, plugins: PluginManager, model: Model, kv: OffloadableKV,
                hf_config: dict[str, Any]) -> dict[int, OffloadTier]:
    """One first tier (with its stores beneath) per copied group, by group index."""
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
    tensors = group_tensors(model, kv)
    groups = kv_groups_of(model)
    device_bytes = {g: sum(t.numel() * t.element_size() for t in ts)
                    for g, ts in tensors.items()}
    tiers: dict[int, OffloadTier] = {}
    for g, ts in tensors.items():
        share = device_bytes[g] / sum(device_bytes.values())
        block_gib = sum(t[0].numel() * t.element_size() for t in ts) / (1 << 30)
        # A group's share holds at least one of its blocks.
        group_config = config if len(tensors) == 1 else dataclasses.replace(
            config, kv_offload_host_gib=max(config.kv_offload_host_gib * share, block_gib),
            kv_offload_disk_gib=max(config.kv_offload_disk_gib * share, 2 * block_gib))
        label = groups[g].name if len(tensors) > 1 else None
        context = OffloadContext(ts, config.block_size,
                                 fingerprint(config, hf_config, ts, group=label), group_config,
                                 OFFLOAD_DEVICE_BYTES // len(tensors))
        stores: list[BlockStore] = [registry.resolve(n)(context) for n in below]
        tiers[g] = registry.resolve(first)(context, stores)
        log.info("KV offload%s: %s (fingerprint %s)", f" of group {label}" if label else "",
                 " -> ".join(config.kv_offload), context.fingerprint)
    return tiers


def merged_stats(tiers: Sequence[OffloadTier]) -> tuple[TierStats, ...]:
    """Each tier's totals summed over the groups' chains (blocks of every group count)."""
    chains = [list(t.stats()) for t in tiers]
    counts = ("hits", "saved", "bytes_in", "bytes_out", "used_blocks", "capacity_blocks")
    return tuple(TierStats(column[0].name, disabled=any(s.disabled for s in column),
                           **{f: sum(getattr(s, f) for s in column) for f in counts})
                 for column in zip(*chains, strict=True))
