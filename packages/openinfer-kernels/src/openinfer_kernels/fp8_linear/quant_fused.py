# mypy: disable-error-code="no-untyped-def"
"""The W8A8 product's activation quantization fused into the kernel that makes the
activation, for prompt-size steps: RMSNorm (with or without the residual add) and the gated
MLP's silu(gate) * up each write the e4m3 values and per-row 128-column group scales that
`fp8_w8a8_linear` reads, in `fp8_group_quant`'s layout, instead of a bf16 activation that a
second kernel reads back to quantize (at 2048 tokens of Qwen3-8B the down projection's input
alone is 50 MB written and read again a layer).

Each value is first rounded to the activation's dtype exactly where the unfused kernel stores
it, then quantized by the same math (`w8a8_triton.quantize_groups`), so the result is bit for
bit the unfused pair's: `fp8_group_quant(rms_norm(...))` and so on (the references compose
them that way). Widths must be whole 128-column groups.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_kernels.fp8_linear.reference import AMAX_FLOOR, E4M3_MAX, GROUP
from openinfer_kernels.fp8_linear.w8a8_triton import (
    _group_quant_kernel,
    group_quant_outputs,
    quantize_groups,
)
from openinfer_kernels.norm.triton import row_settings
from openinfer_kernels.pdl import pdl_enter, pdl_launch

NORM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SILU_ROWS = 32  # rows a program quantizes, one group of columns each (as fp8_group_quant)


@triton.jit
def _store_row_groups(v, q_ptr, s_ptr, row, H, stride_qm, stride_sm, stride_sk,
                      BLOCK_H: tl.constexpr, GROUP: tl.constexpr, AMAX_FLOOR: tl.constexpr,
                      E4M3_MAX: tl.constexpr):
    """One row's fp32 values v [BLOCK_H] (0 past H) quantized per GROUP columns and stored."""
    groups = tl.reshape(v, [BLOCK_H // GROUP, GROUP])
    q, scale = quantize_groups(groups, AMAX_FLOOR, E4M3_MAX)
    cols = tl.arange(0, BLOCK_H // GROUP)[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    tl.store(q_ptr + row * stride_qm + cols, q.to(q_ptr.dtype.element_ty), mask=cols < H)
    g = tl.arange(0, BLOCK_H // GROUP)
    tl.store(s_ptr + row * stride_sm + g * stride_sk, scale, mask=g * GROUP < H)


@triton.jit
def _norm_quant_kernel(x_ptr, res_ptr, w_ptr, sum_ptr, q_ptr, s_ptr, x_row_stride,
                       res_row_stride, H, eps, stride_qm, stride_sm, stride_sk,
                       ADD: tl.constexpr, BLOCK_H: tl.constexpr, GROUP: tl.constexpr,
                       AMAX_FLOOR: tl.constexpr, E4M3_MAX: tl.constexpr, PDL: tl.constexpr):
    # One row a program. ADD: x + residual first, the sum stored (rounded to x's dtype) and
    # normalised as stored (norm/triton.py's `_add_rms_norm_row`); else `_rms_norm_kernel`.
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0)
    dtype = x.dtype
    s = x.to(tl.float32)
    if ADD:
        r = tl.load(res_ptr + row * res_row_stride + cols, mask=mask, other=0.0)
        summed = (s + r.to(tl.float32)).to(dtype)
        tl.store(sum_ptr + row * H + cols, summed, mask=mask)
        s = summed.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(s * s, axis=0) / H + eps)
    normed = ((s * inv_rms).to(dtype).to(tl.float32) * w).to(dtype).to(tl.float32)
    _store_row_groups(normed, q_ptr, s_ptr, row, H, stride_qm, stride_sm, stride_sk, BLOCK_H,
                      GROUP, AMAX_FLOOR, E4M3_MAX)


def _check(x: torch.Tensor, width: int, what: str) -> None:
    if x.dim() != 2 or x.stride(1) != 1 or x.dtype not in NORM_DTYPES or width % GROUP:
        raise ValueError(f"{what}: needs [M, K] bf16, fp16 or fp32 rows, K contiguous and a "
                         f"whole number of {GROUP}-column groups; got {x.dtype} {tuple(x.shape)} "
                         f"strides {x.stride()}")


def _norm_quant(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    m, h = x.shape
    _check(x, h, "rms_norm_group_quant")
    q, scale = group_quant_outputs(m, h, x.device)
    summed = None
    res = x
    if residual is not None:
        res = residual if residual.stride(-1) == 1 else residual.contiguous()
        summed = torch.empty_like(x, memory_format=torch.contiguous_format)
    if m:
        block, num_warps = row_settings(h)
        _norm_quant_kernel[(m,)](
            x, res, weight, x if summed is None else summed, q, scale, x.stride(0),
            res.stride(0), h, eps, q.stride(0), scale.stride(0), scale.stride(1),
            ADD=residual is not None, BLOCK_H=max(block, GROUP), GROUP=GROUP,
            AMAX_FLOOR=AMAX_FLOOR, E4M3_MAX=E4M3_MAX, num_warps=num_warps, **pdl_launch(x))
    return q, scale, summed


def rms_norm_group_quant_triton(x: torch.Tensor, weight: torch.Tensor,
                                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`fp8_group_quant(rms_norm(x, weight, eps))` in one kernel: x [M, H] (bf16, fp16 or
    fp32), H a multiple of 128 -> (e4m3 [M, H], fp32 scales [M, H / 128]), the same bits."""
    q, scale, _ = _norm_quant(x, None, weight, eps)
    return q, scale


def add_rms_norm_group_quant_triton(x: torch.Tensor, residual: torch.Tensor,
                                    weight: torch.Tensor, eps: float
                                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`fused_add_rms_norm` whose normed output is quantized as `fp8_group_quant` does, in one
    kernel: (e4m3 [M, H], fp32 scales [M, H / 128], x + residual), the same bits."""
    q, scale, summed = _norm_quant(x, residual, weight, eps)
    assert summed is not None
    return q, scale, summed


def silu_mul_group_quant_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`fp8_group_quant(silu_and_mul(x))` in one kernel: x = [gate | up] ([M, 2I] bf16/fp16, I
    a multiple of 128; or fp32) -> (e4m3 [M, I], fp32 scales [M, I / 128]), the same bits."""
    inter = x.shape[-1] // 2
    _check(x, inter, "silu_mul_group_quant")
    m = x.shape[0]
    q, scale = group_quant_outputs(m, inter, x.device)
    if m:
        rows = min(SILU_ROWS, triton.next_power_of_2(m))
        _group_quant_kernel[(triton.cdiv(m, rows), inter // GROUP)](
            x, q, scale, m, inter, x.stride(0), q.stride(0), scale.stride(0), scale.stride(1),
            ROWS=rows, GROUP=GROUP, AMAX_FLOOR=AMAX_FLOOR, E4M3_MAX=E4M3_MAX, SILU=True,
            num_warps=4, **pdl_launch(x))
    return q, scale
