"""Per-layer scales of an FP8 KV cache, read from a checkpoint under vLLM's names.

An e4m3 page holds k / k_scale (and v / v_scale); attention reads it back times the scale. A
checkpoint calibrated for an FP8 KV cache (llm-compressor, ModelOpt) carries one scalar per
layer for each; without them the scales are 1.0, as vLLM's are."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from openinfer_core.errors import WeightLoadError
from openinfer_core.weights.checkpoint import Checkpoint
from openinfer_core.weights.random_checkpoint import RandomCheckpoint

log = logging.getLogger("openinfer")


@dataclass(frozen=True, slots=True)
class KVScales:
    """One layer's per-tensor scales: the cached value times the scale is the key (value)."""

    k: float = 1.0
    v: float = 1.0


# (key scale, value scale) under a layer's attention prefix, as vLLM reads them
# (`maybe_remap_kv_scale_name`, compressed-tensors' output scales); the first pair present wins.
SCALE_NAMES = (
    ("k_scale", "v_scale"),  # llm-compressor, vLLM
    ("k_proj.k_scale", "v_proj.v_scale"),  # NVIDIA ModelOpt
    ("k_proj.output_scale", "v_proj.output_scale"),  # compressed-tensors' kv_cache_scheme
    ("kv_scale", "kv_scale"),  # deprecated in vLLM: one scale for both
)


def read_kv_scales(ckpt: Checkpoint | RandomCheckpoint,
                   attention_prefixes: Sequence[str]) -> list[KVScales]:
    """Each layer's scales, given its attention prefix ("model.layers.0.self_attn."); 1.0 for
    a layer whose checkpoint has none (and for a dummy checkpoint). Raises `WeightLoadError`
    naming a scale that is not one positive finite number."""
    if isinstance(ckpt, RandomCheckpoint):
        return [KVScales() for _ in attention_prefixes]
    scales = [_layer_scales(ckpt, prefix) for prefix in attention_prefixes]
    if all(s == KVScales() for s in scales):
        log.info("FP8 KV cache: the checkpoint has no k_scale / v_scale; scales are 1.0 "
                 "(values past +-448 saturate)")
    return scales


def _layer_scales(ckpt: Checkpoint, prefix: str) -> KVScales:
    for k_name, v_name in SCALE_NAMES:
        if prefix + k_name in ckpt and prefix + v_name in ckpt:
            return KVScales(_scalar(ckpt, prefix + k_name), _scalar(ckpt, prefix + v_name))
    return KVScales()


def _scalar(ckpt: Checkpoint, name: str) -> float:
    tensor = ckpt.get(name)
    if tensor.numel() != 1:
        raise WeightLoadError(
            f"tensor {name!r} has shape {list(tensor.shape)}: an FP8 KV-cache scale must be "
            "one number per layer (per-head scales are not supported)")
    value = float(tensor.float().item())
    if not (math.isfinite(value) and value > 0):
        raise WeightLoadError(f"tensor {name!r} is {value}: a KV-cache scale must be > 0")
    return value
