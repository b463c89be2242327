# mypy: disable-error-code="no-untyped-def"
"""Scattering a step's keys and values into the paged cache: program (t, h) copies head h of token
t (k and v, converted to the cache dtype) into its slot. Same contract as reference.py.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_kernels.pdl import pdl_enter, pdl_launch


@triton.jit
def _kv_append_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, k_stride_t, k_stride_h,
                      v_stride_t, v_stride_h, cache_stride_slot, D: tl.constexpr,
                      BLOCK_D: tl.constexpr, PDL: tl.constexpr):
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
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    v = tl.load(v_ptr + t * v_stride_t + h * v_stride_h + offs, mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def kv_append_triton(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store token t's k/v ([T, Hk, D], strided views allowed) at flat slot `slot_mapping[t]` of
    the contiguous caches ([num_blocks, block_size, Hk, D]); slot = block_id * block_size +
    offset. A negative slot skips its token. Mutates the caches. Unlike the reference, a slot past
    the end is not checked (it would write out of bounds): slots come from the block manager."""
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
            **pdl_launch(k))
