# mypy: disable-error-code="no-untyped-def"
"""Scattering a step's keys and values into the paged cache: program (t, h) copies head h of token
t (k and v, converted to the cache dtype; quantized for an e4m3 cache) into its slot. Same
contract as reference.py.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_kernels.e4m3 import round_to_e4m3
from openinfer_kernels.kv_store.reference import FP8_KV_DTYPE
from openinfer_kernels.pdl import pdl_enter, pdl_launch


@triton.jit
def quantize_for_cache(x, inv_scale, FP8: tl.constexpr):
    """`x` ready for the cache's dtype cast: for an e4m3 cache (FP8) x * inv_scale in fp32,
    saturated at +-448 and rounded to the e4m3 grid, as `quantize_kv`; else x."""
    # One return: Triton compiles every return of a function to one type, even behind a
    # constexpr branch.
    if FP8:  # noqa: SIM108 (a Triton constexpr branch, kept as statements)
        out = round_to_e4m3(tl.clamp(x.to(tl.float32) * inv_scale, -448.0, 448.0))
    else:
        out = x
    return out


@triton.jit
def inverse_scale(scale_ptr, heads, FP8: tl.constexpr):
    """For an e4m3 cache (FP8), 1 / the scales of `heads` (an index or a tensor of them),
    rounded once as torch's fp32 division is (the reference's; Triton's `/` may be off by an
    ulp on the GPU); else 1.0, nothing read."""
    if FP8:  # noqa: SIM108 (a Triton constexpr branch, kept as statements)
        inv = tl.math.div_rn(1.0, tl.load(scale_ptr + heads))
    else:
        inv = 1.0
    return inv


def fp8_scale_tensors(cache: torch.Tensor, k_scale: torch.Tensor | None,
                      v_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """What the kernels read the scales of `cache` ([..., Hk, D]) from: for an e4m3 cache the
    fp32 [Hk] scales (1.0 for None: a new tensor each call, so a CUDA graph must be given its
    own); for any other cache the cache itself, a pointer the kernels never read."""
    if cache.dtype != FP8_KV_DTYPE:
        return cache, cache
    heads = cache.shape[-2]
    scales = []
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None:
            scale = torch.ones(heads, dtype=torch.float32, device=cache.device)
        if (scale.dtype != torch.float32 or scale.shape != (heads,)
                or scale.device != cache.device or not scale.is_contiguous()):
            raise ValueError(f"{name} must be a contiguous fp32 tensor of one scale per KV head "
                             f"([{heads}]) on {cache.device}, got {scale.dtype} "
                             f"{list(scale.shape)} on {scale.device}")
        scales.append(scale)
    return scales[0], scales[1]


def fp8_cache_args(cache: torch.Tensor, k_scale: torch.Tensor | None,
                   v_scale: torch.Tensor | None) -> dict[str, object]:
    """The store kernels' quantization arguments for `cache`: the scale pointers, and FP8."""
    k_ptr, v_ptr = fp8_scale_tensors(cache, k_scale, v_scale)
    return {"k_scale_ptr": k_ptr, "v_scale_ptr": v_ptr, "FP8": cache.dtype == FP8_KV_DTYPE}


@triton.jit
def _kv_append_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, k_stride_t, k_stride_h,
                      v_stride_t, v_stride_h, cache_stride_slot, k_scale_ptr, v_scale_ptr,
                      D: tl.constexpr, BLOCK_D: tl.constexpr, FP8: tl.constexpr,
                      PDL: tl.constexpr):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + t)  # int64: slot * stride indexes the whole cache
    offs = tl.arange(0, BLOCK_D)
    # A negative slot writes nothing: no column is in range. (Not `(offs < D) & (slot >= 0)`:
    # the Triton 3.9 interpreter turns a splatted scalar bool into integers there.)
    mask = offs < tl.where(slot >= 0, D, 0)
    dst = slot * cache_stride_slot + h * D + offs
    k = tl.load(k_ptr + t * k_stride_t + h * k_stride_h + offs, mask=mask)
    k = quantize_for_cache(k, inverse_scale(k_scale_ptr, h, FP8), FP8)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    v = tl.load(v_ptr + t * v_stride_t + h * v_stride_h + offs, mask=mask)
    v = quantize_for_cache(v, inverse_scale(v_scale_ptr, h, FP8), FP8)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def kv_append_triton(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
                     k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None) -> None:
    """Store token t's k/v ([T, Hk, D], strided views allowed) at flat slot `slot_mapping[t]` of
    the contiguous caches ([num_blocks, block_size, Hk, D]); slot = block_id * block_size +
    offset. A negative slot skips its token. An e4m3 cache stores head h's k / k_scale[h] and
    v / v_scale[h] (fp32 [Hk] on the device, 1.0 where None; `quantize_kv`). Mutates the
    caches. Unlike the reference, a slot past the end is not
    checked (it would write out of bounds): slots come from the block manager."""
    t, heads, dim = k.shape
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("kv_append: the caches must be contiguous [num_blocks, block_size, Hk, D]")
    if k_cache.shape[2:] != (heads, dim) or v.shape != k.shape or v_cache.shape != k_cache.shape:
        raise ValueError(f"kv_append: k/v {tuple(k.shape)}, {tuple(v.shape)} do not fit caches "
                         f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    if t:
        _kv_append_kernel[(t, heads)](
            k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0),
            v.stride(1), k_cache.stride(1), D=dim, BLOCK_D=triton.next_power_of_2(dim),
            **fp8_cache_args(k_cache, k_scale, v_scale), **pdl_launch(k))
