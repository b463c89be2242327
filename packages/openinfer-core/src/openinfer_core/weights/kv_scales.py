"""Per-layer scales of an FP8 KV cache, read from a checkpoint under vLLM's names.

An e4m3 page holds k / k_scale (and v / v_scale); attention reads it back times the scale. A
checkpoint calibrated for an FP8 KV cache (llm-compressor, ModelOpt) carries, per layer, one
scale for each (per tensor) or one per KV head (compressed-tensors' `kv_cache_scheme` with
strategy `attn_head`, stored as [Hkv, 1, 1]); without them the scales are 1.0, as vLLM's
are. Either way a layer's scales come back as `KVScales`, one per KV head."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

from openinfer_core.errors import WeightLoadError
from openinfer_core.interfaces.attention import KVScales
from openinfer_core.weights.checkpoint import Checkpoint
from openinfer_core.weights.random_checkpoint import RandomCheckpoint

log = logging.getLogger("openinfer")

# (key scale, value scale) under a layer's attention prefix, as vLLM reads them
# (`maybe_remap_kv_scale_name`, compressed-tensors' output scales); the first pair present wins.
SCALE_NAMES = (
    ("k_scale", "v_scale"),  # llm-compressor, vLLM; compressed-tensors' attn_head too
    ("k_proj.k_scale", "v_proj.v_scale"),  # NVIDIA ModelOpt
    ("k_proj.output_scale", "v_proj.output_scale"),  # compressed-tensors' kv_cache_scheme
    ("kv_scale", "kv_scale"),  # deprecated in vLLM: one scale for both
)


def read_kv_scales(ckpt: Checkpoint | RandomCheckpoint, attention_prefixes: Sequence[str],
                   num_kv_heads: int) -> list[KVScales]:
    """Each layer's scales on the host, all `num_kv_heads` of them, given its attention prefix
    ("model.layers.0.self_attn."); 1.0 for a layer whose checkpoint has none (and for a dummy
    checkpoint). Raises `WeightLoadError` naming a scale that is neither one number nor one
    per KV head, or not positive and finite."""
    if isinstance(ckpt, RandomCheckpoint):
        return [KVScales.ones(num_kv_heads) for _ in attention_prefixes]
    scales = [_layer_scales(ckpt, prefix, num_kv_heads) for prefix in attention_prefixes]
    if all(s.per_tensor == (1.0, 1.0) for s in scales):
        log.info("FP8 KV cache: the checkpoint has no k_scale / v_scale; scales are 1.0 "
                 "(values past +-448 saturate)")
    elif any(s.per_tensor is None for s in scales):
        log.info("FP8 KV cache: per-head k/v scales (%d KV heads)", num_kv_heads)
    return scales


def _layer_scales(ckpt: Checkpoint, prefix: str, num_kv_heads: int) -> KVScales:
    for k_name, v_name in SCALE_NAMES:
        if prefix + k_name in ckpt and prefix + v_name in ckpt:
            return KVScales.of(_per_head(ckpt, prefix + k_name, num_kv_heads),
                               _per_head(ckpt, prefix + v_name, num_kv_heads))
    return KVScales.ones(num_kv_heads)


def _per_head(ckpt: Checkpoint, name: str, num_kv_heads: int) -> torch.Tensor:
    """Tensor `name` as fp32 [num_kv_heads]: one number repeated, or one per head in any shape
    that has num_kv_heads elements along one dimension ([Hkv], [Hkv, 1], [Hkv, 1, 1], ...)."""
    tensor = ckpt.get(name)
    sizes = [n for n in tensor.shape if n != 1]
    if tensor.numel() == 1:
        values = tensor.float().flatten().expand(num_kv_heads)
    elif sizes == [num_kv_heads]:
        values = tensor.float().flatten()
    else:
        raise WeightLoadError(
            f"tensor {name!r} has shape {list(tensor.shape)}: an FP8 KV-cache scale must be "
            f"one number per layer or one per KV head ({num_kv_heads}, e.g. shape "
            f"[{num_kv_heads}] or [{num_kv_heads}, 1, 1])")
    bad = [v for v in values.tolist() if not (math.isfinite(v) and v > 0)]
    if bad:
        raise WeightLoadError(f"tensor {name!r} holds {bad[0]}: a KV-cache scale must be a "
                              "finite number > 0")
    return values.contiguous()
