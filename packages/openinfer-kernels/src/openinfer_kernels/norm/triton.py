# mypy: disable-error-code="no-untyped-def"
"""RMSNorm kernels: one program per row, the whole row in one block (H up to 8192 or so), fp32
math, output in the input's dtype. Same signatures and results as reference.py.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_kernels.pdl import pdl_enter, pdl_launch


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, x_row_stride, out_row_stride, H, eps,
                     BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride can pass 2^31 on long prefills
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)
    # Rounded to the output dtype before the weight, as transformers and vLLM do.
    out = (x * inv_rms).to(out_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _add_rms_norm_row(x, r, w, out_ptr, sum_ptr, row, H, eps, cols, mask,
                      W_PTR: tl.constexpr = False):
    # x, r: this row of the addend and of the residual, fp32; w: the weight, fp32 (or, with
    # W_PTR, its pointer: read here, after the sum is stored). Round the sum into the stream's
    # dtype first and normalise the rounded value: the next layer adds to exactly what is
    # stored, as in the reference.
    summed = (x + r).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + row * H + cols, summed, mask=mask)
    if W_PTR:
        w = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
    s = summed.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(s * s, axis=0) / H + eps)
    normed = (s * inv_rms).to(out_ptr.dtype.element_ty).to(tl.float32)  # as rms_norm
    tl.store(out_ptr + row * H + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fused_add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, x_row_stride,
                               res_row_stride, H, eps, BLOCK_H: tl.constexpr,
                               PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + row * res_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    # The weight is read after the sum's store: read up front with the others, a 2048-token
    # Qwen3-8B first step is slower (`openinfer bench latency` A/B, H100).
    _add_rms_norm_row(x, r, w_ptr, out_ptr, sum_ptr, row, H, eps, cols, mask, True)


@triton.jit
def _split_sum_add_rms_norm_kernel(part_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, M,
                                   res_row_stride, H, eps, SPLIT_K: tl.constexpr,
                                   BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    # The addend is a split-K product's fp32 shares [SPLIT_K, M, H]: summed in a fixed order and
    # rounded as the linear layer's output would be, then as _fused_add_rms_norm_kernel.
    # The kernel before is the product's; the residual and the weight are read before the wait,
    # overlapping its drain: they were written before it was launched, by a kernel at least two
    # back, and under PDL this one starts only once the one before has passed its own wait.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    r = tl.load(res_ptr + row * res_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    pdl_enter(PDL)
    x = tl.zeros([BLOCK_H], dtype=tl.float32)
    for s in range(SPLIT_K):
        x += tl.load(part_ptr + (s * M + row) * H + cols, mask=mask, other=0.0)
    x = x.to(out_ptr.dtype.element_ty).to(tl.float32)
    _add_rms_norm_row(x, r, w, out_ptr, sum_ptr, row, H, eps, cols, mask)


def row_settings(h: int) -> tuple[int, int]:
    """(BLOCK_H, num_warps) for one row of `h` elements per program (Liger's heuristic)."""
    block = triton.next_power_of_2(h)
    num_warps = 16 if block >= 8192 else 8 if block >= 2048 else 4
    return block, num_warps


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, H] with unit stride along H (a view when it can be one)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension."""
    rows = _rows(x)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.numel():
        block, num_warps = row_settings(rows.shape[1])
        _rms_norm_kernel[(rows.shape[0],)](rows, weight, out, rows.stride(0), out.stride(0),
                                           rows.shape[1], eps, BLOCK_H=block,
                                           num_warps=num_warps, **pdl_launch(x))
    return out.view(x.shape)


def fused_add_rms_norm_triton(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the pre-norm residual stream in one pass.
    Out of place, like the reference: x and residual are left as they were."""
    rows, res = _rows(x), _rows(residual)
    normed = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    summed = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.numel():
        block, num_warps = row_settings(rows.shape[1])
        _fused_add_rms_norm_kernel[(rows.shape[0],)](
            rows, res, weight, normed, summed, rows.stride(0), res.stride(0), rows.shape[1], eps,
            BLOCK_H=block, num_warps=num_warps, **pdl_launch(x))
    return normed.view(x.shape), summed.view(x.shape)


def split_sum_add_rms_norm_triton(partials: torch.Tensor, residual: torch.Tensor,
                                  weight: torch.Tensor, eps: float
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """`fused_add_rms_norm_triton(x, residual, ...)` where x is the sum of a split-K linear's
    fp32 shares `partials` ([S, M, H], contiguous), rounded to residual's dtype: the sum of the
    shares and the add + norm in one launch. Launched right after the kernel that writes the
    shares: with PDL it reads `residual` and `weight` while that kernel drains."""
    splits, m, h = partials.shape
    res = _rows(residual)
    normed = torch.empty((m, h), dtype=residual.dtype, device=residual.device)
    summed = torch.empty((m, h), dtype=residual.dtype, device=residual.device)
    if m:
        block, num_warps = row_settings(h)
        _split_sum_add_rms_norm_kernel[(m,)](
            partials, res, weight, normed, summed, m, res.stride(0), h, eps, SPLIT_K=splits,
            BLOCK_H=block, num_warps=num_warps, **pdl_launch(residual))
    return normed, summed


def qk_rms_norm_triton(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                       k_weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm of q ([T, Hq, D]) and k ([T, Hk, D]) over D (Qwen3's q_norm/k_norm).
    Strided q/k views are copied into rows first; qk_norm_rope fuses this with rotary instead."""
    return rms_norm_triton(q, q_weight, eps), rms_norm_triton(k, k_weight, eps)
