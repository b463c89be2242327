# mypy: disable-error-code="no-untyped-def"
"""Per-head q/k RMSNorm then rotary, in one launch: program (t, j) reads a tile of token t's
heads (q heads first, then k heads; one head a tile on decode steps, up to 8 on prefill ones,
`heads_per_program`) straight from the strided q/k views, normalises it in fp32, rotates it and
writes it once (`qk_norm_rope_append_triton`: the k heads, and v beside them, into the paged
cache, which saves the step's kv_append launch). Unlike the reference, the normed values stay in
fp32 between norm and rotation instead of being rounded to the input dtype, so in bf16 the two
differ by up to about one ulp of the normed values (fp32 results agree to rounding).
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_kernels.kv_store.triton import fp8_cache_args, inverse_scale, quantize_for_cache
from openinfer_kernels.pdl import pdl_enter, pdl_launch


@triton.jit
def _norm_rope_params(w_ptr, cos_ptr, D: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """A head's norm weight halves and its position's cos / sin, in fp32."""
    half: tl.constexpr = D // 2
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    w1 = tl.load(w_ptr + offs, mask=offs < half, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + half + offs, mask=offs < half, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + offs, mask=offs < half, other=0.0).to(tl.float32)
    sin = tl.load(cos_ptr + half + offs, mask=offs < half, other=0.0).to(tl.float32)
    return w1, w2, cos, sin


@triton.jit
def _norm_rope_heads(src, src_stride_h, n_heads, w1, w2, cos, sin, dst, eps, D: tl.constexpr,
                     BLOCK_HALF: tl.constexpr, HEADS: tl.constexpr, write=True, inv_scale=1.0,
                     FP8: tl.constexpr = False):
    # Heads 0..n_heads-1 (of a tile of HEADS) of one token: src head h at src + h * src_stride_h,
    # written contiguously at dst + h * D. With FP8 dst is an e4m3 cache: the values are
    # rounded to src's dtype as they would be written there, then quantized
    # (`quantize_for_cache`), as the reference's kv_append does with its rotated k.
    half: tl.constexpr = D // 2
    h = tl.arange(0, HEADS)[:, None]
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < n_heads) & (offs < half)
    store = mask & (offs < tl.where(write, half, 0))
    head = src + h * src_stride_h
    x1 = tl.load(head + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(head + half + offs, mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D + eps)[:, None]
    out_ty = src.dtype.element_ty if FP8 else dst.dtype.element_ty
    n1 = ((x1 * inv_rms).to(out_ty).to(tl.float32) * w1).to(out_ty).to(tl.float32)
    n2 = ((x2 * inv_rms).to(out_ty).to(tl.float32) * w2).to(out_ty).to(tl.float32)
    # cos / sin rounded to the output dtype first, as the reference's table is.
    cos = cos.to(out_ty).to(tl.float32)
    sin = sin.to(out_ty).to(tl.float32)
    out = dst + h * D
    dst_ty = dst.dtype.element_ty
    r1 = quantize_for_cache((n1 * cos - n2 * sin).to(out_ty), inv_scale, FP8)
    r2 = quantize_for_cache((n2 * cos + n1 * sin).to(out_ty), inv_scale, FP8)
    tl.store(out + offs, r1.to(dst_ty), mask=store)
    tl.store(out + half + offs, r2.to(dst_ty), mask=store)


@triton.jit
def _qk_norm_rope_kernel(q_ptr, k_ptr, qw_ptr, kw_ptr, q_out_ptr, k_out_ptr, pos_ptr, cos_sin_ptr,
                         q_stride_t, q_stride_h, k_stride_t, k_stride_h, cos_sin_stride, eps,
                         HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
                         BLOCK_HALF: tl.constexpr, HEADS: tl.constexpr, PDL: tl.constexpr):
    # Program (t, j): heads j*HEADS.. of token t's q, then (past the q tiles) of its k.
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    q_tiles: tl.constexpr = (HQ + HEADS - 1) // HEADS
    is_q = j < q_tiles
    if HEADS > 1:  # a prompt step: wait first (see _qk_norm_rope_append_kernel)
        pdl_enter(PDL)
    cos_ptr = cos_sin_ptr + tl.load(pos_ptr + t) * cos_sin_stride
    # Before the wait on decode-size steps: the norm weights, positions and table, which no
    # kernel of the step writes (see _qk_norm_rope_append_kernel).
    w1, w2, cos, sin = _norm_rope_params(tl.where(is_q, qw_ptr, kw_ptr), cos_ptr, D,
                                         BLOCK_HALF)
    if HEADS == 1:
        pdl_enter(PDL)
    if is_q:
        h0 = j * HEADS
        _norm_rope_heads(q_ptr + t * q_stride_t + h0 * q_stride_h, q_stride_h, HQ - h0, w1, w2,
                         cos, sin, q_out_ptr + (t * HQ + h0) * D, eps, D, BLOCK_HALF, HEADS)
    else:
        h0 = (j - q_tiles) * HEADS
        _norm_rope_heads(k_ptr + t * k_stride_t + h0 * k_stride_h, k_stride_h, HK - h0, w1, w2,
                         cos, sin, k_out_ptr + (t * HK + h0) * D, eps, D, BLOCK_HALF, HEADS)


@triton.jit
def _qk_norm_rope_append_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, q_out_ptr, k_cache_ptr,
                                v_cache_ptr, slot_ptr, pos_ptr, cos_sin_ptr, q_stride_t,
                                q_stride_h, k_stride_t, k_stride_h, v_stride_t, v_stride_h,
                                cos_sin_stride, cache_stride_slot, eps, k_scale_ptr,
                                v_scale_ptr, HQ: tl.constexpr, HK: tl.constexpr,
                                D: tl.constexpr, BLOCK_HALF: tl.constexpr,
                                BLOCK_D: tl.constexpr, HEADS: tl.constexpr, FP8: tl.constexpr,
                                PDL: tl.constexpr):
    # On decode-size steps (one head a program), before the wait, overlapping the q/k/v
    # projection's drain: the norm weights, and the step's positions and slots with the rotary
    # table, which the host writes (or a kernel at least two back: under PDL a kernel starts
    # once the one before it has passed its wait). Prompt steps wait first: reading these
    # before the wait makes a 2048-token Qwen3-8B first step ~1 ms slower (`openinfer bench
    # latency`, H100).
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    q_tiles: tl.constexpr = (HQ + HEADS - 1) // HEADS
    is_q = j < q_tiles
    if HEADS > 1:
        pdl_enter(PDL)
    cos_ptr = cos_sin_ptr + tl.load(pos_ptr + t) * cos_sin_stride
    w1, w2, cos, sin = _norm_rope_params(tl.where(is_q, qw_ptr, kw_ptr), cos_ptr, D,
                                         BLOCK_HALF)
    slot = tl.load(slot_ptr + t)  # int64: slot * stride indexes the whole cache
    if HEADS == 1:
        pdl_enter(PDL)
    if is_q:
        h0 = j * HEADS
        _norm_rope_heads(q_ptr + t * q_stride_t + h0 * q_stride_h, q_stride_h, HQ - h0, w1, w2,
                         cos, sin, q_out_ptr + (t * HQ + h0) * D, eps, D, BLOCK_HALF, HEADS)
    else:
        h0 = (j - q_tiles) * HEADS
        dst = slot * cache_stride_slot + h0 * D
        h = tl.arange(0, HEADS)[:, None]
        # The tile's heads' scales; a tile's padding heads (never stored) read the last one's.
        heads = tl.minimum(h0 + h, HK - 1)
        _norm_rope_heads(k_ptr + t * k_stride_t + h0 * k_stride_h, k_stride_h, HK - h0, w1, w2,
                         cos, sin, k_cache_ptr + dst, eps, D, BLOCK_HALF, HEADS, slot >= 0,
                         inverse_scale(k_scale_ptr, heads, FP8), FP8)
        offs = tl.arange(0, BLOCK_D)[None, :]
        mask = (h < HK - h0) & (offs < tl.where(slot >= 0, D, 0))
        v = tl.load(v_ptr + t * v_stride_t + (h0 + h) * v_stride_h + offs, mask=mask)
        v = quantize_for_cache(v, inverse_scale(v_scale_ptr, heads, FP8), FP8)
        tl.store(v_cache_ptr + dst + h * D + offs, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def heads_per_program(tokens: int, heads: int) -> int:
    """Heads one program normalises and rotates: one each for a few tokens (decode: more
    programs, each short), up to 8 on prefill steps, where a program per head is too small
    to stream at the read bandwidth."""
    return 1 if tokens < 64 else min(8, triton.next_power_of_2(heads))


def _warps(heads: int, block_half: int) -> int:
    """A warp per 32 pairs of a head's halves, 1 to 4 (8 for the 8-head tiles)."""
    return max(1, min(8 if heads >= 8 else 4, heads * block_half // 32))


def _unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def qk_norm_rope_triton(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                        k_weight: torch.Tensor, eps: float, positions: torch.Tensor,
                        cos_sin: torch.Tensor, *, heads: int | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """rotary_embedding(qk_rms_norm(q, k, ...), positions, cos_sin) for q ([T, Hq, D]) and k
    ([T, Hk, D]), which may be strided views (e.g. column slices of a fused qkv output); returns
    new contiguous tensors in q's dtype."""
    t, hq, d = q.shape
    hk = k.shape[1]
    if d % 2 or k.shape != (t, hk, d) or cos_sin.shape[-1] != d:
        raise ValueError(f"qk_norm_rope: need q [T, Hq, D], k [T, Hk, D], cos_sin [*, D] with D "
                         f"even; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(cos_sin.shape)}")
    q, k, cos_sin = _unit_last_stride(q), _unit_last_stride(k), _unit_last_stride(cos_sin)
    q_out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((t, hk, d), dtype=q.dtype, device=q.device)
    if t:
        block_half = triton.next_power_of_2(d // 2)
        heads = heads or heads_per_program(t, max(hq, hk))
        _qk_norm_rope_kernel[(t, triton.cdiv(hq, heads) + triton.cdiv(hk, heads))](
            q, k, q_weight, k_weight, q_out, k_out, positions, cos_sin,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin.stride(0), eps,
            HQ=hq, HK=hk, D=d, BLOCK_HALF=block_half, HEADS=heads,
            num_warps=_warps(heads, block_half), **pdl_launch(q))
    return q_out, k_out


def qk_norm_rope_append_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                               positions: torch.Tensor, cos_sin: torch.Tensor,
                               k_cache: torch.Tensor, v_cache: torch.Tensor,
                               slot_mapping: torch.Tensor, *, heads: int | None = None,
                               k_scale: torch.Tensor | None = None,
                               v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """`qk_norm_rope_triton`, then `kv_append_triton` of the rotated k and of v ([T, Hk, D],
    strided views allowed) into the contiguous caches at `slot_mapping` (negative: skipped;
    e4m3 caches quantized with the fp32 [Hk] `k_scale`, `v_scale`, 1.0 where None), in one
    launch. Returns the rotated q (new, contiguous); mutates the caches."""
    t, hq, d = q.shape
    hk = k.shape[1]
    if d % 2 or k.shape != (t, hk, d) or v.shape != k.shape or cos_sin.shape[-1] != d:
        raise ValueError(f"qk_norm_rope_append: need q [T, Hq, D], k and v [T, Hk, D], cos_sin "
                         f"[*, D] with D even; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}, {tuple(cos_sin.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("qk_norm_rope_append: the caches must be contiguous "
                         "[num_blocks, block_size, Hk, D]")
    if k_cache.shape[2:] != (hk, d) or v_cache.shape != k_cache.shape:
        raise ValueError(f"qk_norm_rope_append: k/v {tuple(k.shape)} do not fit caches "
                         f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    q, k, v = _unit_last_stride(q), _unit_last_stride(k), _unit_last_stride(v)
    cos_sin = _unit_last_stride(cos_sin)
    q_out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    if t:
        block_half = triton.next_power_of_2(d // 2)
        heads = heads or heads_per_program(t, max(hq, hk))
        _qk_norm_rope_append_kernel[(t, triton.cdiv(hq, heads) + triton.cdiv(hk, heads))](
            q, k, v, q_weight, k_weight, q_out, k_cache, v_cache, slot_mapping, positions,
            cos_sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
            v.stride(1), cos_sin.stride(0), k_cache.stride(1), eps,
            **fp8_cache_args(k_cache, k_scale, v_scale), HQ=hq, HK=hk, D=d,
            BLOCK_HALF=block_half, BLOCK_D=2 * block_half, HEADS=heads,
            num_warps=_warps(heads, block_half), **pdl_launch(q))
    return q_out
