# mypy: disable-error-code="no-untyped-def"
"""The gated MLP activation: program (row, block) computes one column block of silu(gate) * up,
so a wide intermediate size (12288 for Qwen3-8B) spreads over many programs. Same contract as
reference.py.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_kernels.pdl import pdl_enter, pdl_launch

BLOCK = 1024  # columns per program: 12 column blocks a row for Qwen3-8B


@triton.jit
def silu_mul(gate, up, OUT: tl.constexpr, LIMIT: tl.constexpr = 0.0):
    """silu(gate) * up in fp32 from a product's fp32 gate and up columns, with
    `silu_and_mul`'s roundings: both rounded to OUT as an unfused product would store them,
    silu rounded before the product (the epilogue of the gated linear kernels). LIMIT > 0:
    the gate clamped to at most LIMIT and up to +-LIMIT first, exact on the rounded values
    (DeepSeek-V4's clamped SwiGLU, `swiglu_limit`)."""
    g = gate.to(OUT).to(tl.float32)
    u = up.to(OUT).to(tl.float32)
    if LIMIT > 0:
        g = tl.minimum(g, LIMIT)
        u = tl.minimum(tl.maximum(u, -LIMIT), LIMIT)
    return (g / (1.0 + tl.exp(-g))).to(OUT).to(tl.float32) * u


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_row_stride, inter, BLOCK_I: tl.constexpr,
                         PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = cols < inter
    gate = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_row_stride + inter + cols, mask=mask, other=0.0).to(tl.float32)
    # gate / (1 + e^-gate), torch's silu: a very negative gate gives gate / inf = -0, not NaN.
    # silu rounded to the output dtype before the product, as transformers and vLLM do.
    out = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32) * up
    tl.store(out_ptr + row * inter + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """x = [gate | up] ([T, 2I]) -> silu(gate) * up ([T, I])."""
    inter = x.shape[-1] // 2
    rows = x.reshape(-1, 2 * inter)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], inter), dtype=x.dtype, device=x.device)
    if out.numel():
        block = min(BLOCK, triton.next_power_of_2(inter))
        _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(inter, block))](
            rows, out, rows.stride(0), inter, BLOCK_I=block, **pdl_launch(x))
    return out.view(*x.shape[:-1], inter)
