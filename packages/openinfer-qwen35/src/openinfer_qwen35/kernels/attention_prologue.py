# mypy: disable-error-code="no-untyped-def"
"""The gated-attention layer's prologue: per-head q/k RMSNorm, rotary on each head's leading
`rotary_dim` dims (Qwen3.5 rotates a quarter of the head), and v made contiguous for the cache.
`qk_norm_partial_rope_ref` in plain torch (the CPU path and the oracle: norm, rotate the
slices, concatenate), `qk_norm_partial_rope_triton` in one launch of a program per (token,
head) over the q, k and v heads, instead of about twenty torch kernels on a decode step.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_kernels import qk_rms_norm, rotary_embedding


def qk_norm_partial_rope_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                             positions: torch.Tensor, cos_sin: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k and v [T, Hk, D] (views of the projection's output) -> contiguous
    (q, k) normed per head, their first `cos_sin.shape[1]` dims rotated, and v."""
    rd = cos_sin.shape[1]
    q, k = qk_rms_norm(q, k, q_weight, k_weight, eps)
    q_rot, k_rot = rotary_embedding(q[..., :rd], k[..., :rd], positions, cos_sin)
    return (torch.cat([q_rot, q[..., rd:]], dim=-1), torch.cat([k_rot, k[..., rd:]], dim=-1),
            v.contiguous())


@triton.jit
def _prologue_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, q_out, k_out, v_out, pos_ptr,
                     cos_sin_ptr, q_stride_t, k_stride_t, v_stride_t, cos_sin_stride, eps,
                     HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, ROT: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    if j >= HQ + HK:  # a v head: copied
        h = j - HQ - HK
        x = tl.load(v_ptr + t * v_stride_t + h * D + d, mask=ok)
        tl.store(v_out + (t * HK + h) * D + d, x, mask=ok)
        return
    is_q = j < HQ
    h = tl.where(is_q, j, j - HQ)
    src = tl.where(is_q, q_ptr + t * q_stride_t, k_ptr + t * k_stride_t) + h * D
    w_ptr = tl.where(is_q, qw_ptr, kw_ptr)
    dst = tl.where(is_q, q_out + (t * HQ + h) * D, k_out + (t * HK + h) * D)
    x = tl.load(src + d, mask=ok, other=0.0)
    dt = x.dtype
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf) / D + eps)
    # The normed value rounded to the input dtype before the weight and after it, as
    # `qk_rms_norm` rounds; the rotation then reads the rounded values.
    normed = ((xf * inv_rms).to(dt).to(tl.float32)
              * tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32)).to(dt).to(tl.float32)
    half: tl.constexpr = ROT // 2
    rot = d < ROT
    first = d < half
    partner = tl.where(first, d + half, d - half)
    xp = tl.load(src + partner, mask=rot, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=rot, other=0.0).to(tl.float32)
    normed_p = ((xp * inv_rms).to(dt).to(tl.float32) * wp).to(dt).to(tl.float32)
    freq = tl.where(first, d, d - half)
    table = cos_sin_ptr + tl.load(pos_ptr + t) * cos_sin_stride
    # cos and sin rounded to the input dtype, as the reference's table is.
    cos = tl.load(table + freq, mask=rot, other=1.0).to(dt).to(tl.float32)
    sin = tl.load(table + half + freq, mask=rot, other=0.0).to(dt).to(tl.float32)
    rotated = tl.where(first, normed * cos - normed_p * sin, normed * cos + normed_p * sin)
    out = tl.where(rot, rotated, normed)
    tl.store(dst + d, out.to(dt), mask=ok)


def qk_norm_partial_rope_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                                positions: torch.Tensor, cos_sin: torch.Tensor
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`qk_norm_partial_rope_ref`'s results; each input's heads dense within a token."""
    tokens, hq, dim = q.shape
    hk = k.shape[1]
    rot = cos_sin.shape[1]
    for x in (q, k, v):
        if x.stride(2) != 1 or x.stride(1) != dim:
            raise ValueError("qk_norm_partial_rope_triton: each token's heads dense")
    if not cos_sin.is_contiguous() or rot % 2 or rot > dim:
        raise ValueError("qk_norm_partial_rope_triton: a contiguous table, even width <= D")
    q_out = torch.empty(tokens, hq, dim, dtype=q.dtype, device=q.device)
    k_out = torch.empty(tokens, hk, dim, dtype=k.dtype, device=k.device)
    v_out = torch.empty(tokens, hk, dim, dtype=v.dtype, device=v.device)
    if tokens:
        _prologue_kernel[(tokens, hq + 2 * hk)](
            q, k, v, q_weight, k_weight, q_out, k_out, v_out, positions, cos_sin,
            q.stride(0), k.stride(0), v.stride(0), cos_sin.stride(0), eps, HQ=hq, HK=hk,
            D=dim, ROT=rot, BLOCK_D=triton.next_power_of_2(dim))
    return q_out, k_out, v_out


def qk_norm_partial_rope(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                         positions: torch.Tensor, cos_sin: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`qk_norm_partial_rope_ref`'s results; the Triton kernel on CUDA."""
    fn = qk_norm_partial_rope_triton if q.is_cuda else qk_norm_partial_rope_ref
    return fn(q, k, v, q_weight, k_weight, eps, positions, cos_sin)
