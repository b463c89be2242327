"""Writing a step's keys and values into the paged cache."""

from __future__ import annotations

import torch

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3's largest finite value: stores saturate there


def _scale(scale: float | torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`scale` in fp32 shaped to multiply `x`: one number, or one per head ([Hk]) for `x`
    of [..., Hk, D]. A number is the same as that number for every head."""
    s = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    return s[:, None] if s.ndim == 1 else s


def quantize_kv(x: torch.Tensor, cache_dtype: torch.dtype,
                scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """`x` as a cache of `cache_dtype` holds it: converted, or for an e4m3 cache multiplied by
    1 / `scale` in fp32 (the inverse rounded to fp32 first), saturated at +-448 and rounded
    to nearest (vLLM's FP8 KV: the stored value times `scale` is what attention reads).
    `scale` is one number, or one per head ([Hk] for `x` of [..., Hk, D])."""
    if cache_dtype != FP8_KV_DTYPE:
        return x.to(cache_dtype)
    inv = 1.0 / _scale(scale, x)
    return (x.float() * inv).clamp(-FP8_MAX, FP8_MAX).to(cache_dtype)


def dequantize_kv(x: torch.Tensor, scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """Cached values as attention reads them, in fp32: times `scale` (one number, or one per
    head as `quantize_kv`'s) for an e4m3 cache."""
    return x.float() * _scale(scale, x) if x.dtype == FP8_KV_DTYPE else x.float()


def _store(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    num_blocks, block_size, heads, dim = cache.shape
    flat = cache.view(num_blocks * block_size, heads, dim)
    if cache.dtype == FP8_KV_DTYPE:  # torch has no index_copy_ for e4m3: copy its bytes
        flat, rows = flat.view(torch.uint8), rows.view(torch.uint8)
    flat.index_copy_(0, slots, rows)


def kv_append_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
                  k_scale: torch.Tensor | None = None,
                  v_scale: torch.Tensor | None = None) -> None:
    """Store token t's k/v ([T, Hk, D]) at flat slot `slot_mapping[t]` of the caches
    ([num_blocks, block_size, Hk, D]); slot = block_id * block_size + offset. A negative slot
    skips its token (a padded row that must write nothing). An e4m3 cache stores head h's
    k / k_scale[h] and v / v_scale[h] (fp32 [Hk]; 1.0 where None; `quantize_kv`); the
    scales are ignored otherwise. Mutates the caches."""
    keep = slot_mapping >= 0  # on CUDA this mask syncs with the host; the Triton kernel does not
    slots = slot_mapping[keep]
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        _store(cache, slots, quantize_kv(x[keep], cache.dtype, 1.0 if scale is None else scale))
