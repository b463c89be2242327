# mypy: disable-error-code="no-untyped-def"
"""The references' rounding in one launch each, for the model's rows in place:

- `fp8_round_rows_triton`: program = one pool row; its first NOPE values in blocks of 64, each
  block's power-of-two scale from its largest magnitude, values rounded to e4m3 and back;
- `indexer_round_rows_triton` / `indexer_round_triton`: program = BLOCK_M rows of d values;
  the Hadamard rotation as one fp32 product with the d x d matrix (IEEE fp32, no TF32), then
  e2m1 in blocks of 32 with a power-of-two scale.

The rounding is integer and exact-fp32 arithmetic only (no FP8/FP4 casts), so the compiled
kernel and the Triton interpreter round alike: a value v (|v| clamped to the format's maximum)
is a multiple t of its quantum q = 2^(e - mantissa bits), e its exponent (clamped to the
format's smallest normal one), and t rounds to the nearest integer, ties to even. Launches
depend on shapes only: safe in CUDA graphs. (The mypy line above: @triton.jit functions
annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_deepseek_v4.kernels.quant_sim.reference import (
    FP4_BLOCK,
    FP8_BLOCK,
    hadamard_matrix,
)
from openinfer_deepseek_v4.kernels.quant_sim.storage_triton import pow2_ceil, round_to_format
from openinfer_kernels.pdl import pdl_enter, pdl_launch


@triton.jit
def _fp8_rows_kernel(pool_ptr, rows_ptr, stride_row, NOPE: tl.constexpr, BLOCKS: tl.constexpr,
                     BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)  # the rows were written by the kernel before
    row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
    blocks = tl.arange(0, BLOCKS)
    cols = blocks[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    mask = cols < tl.where(row >= 0, NOPE, 0)  # a negative row: skipped
    row = tl.maximum(row, 0)
    ptrs = pool_ptr + row * stride_row + cols
    x = tl.load(ptrs, mask=mask, other=0.0)
    v = x.to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(v), axis=1), 1e-4)
    scale = pow2_ceil(amax * (1.0 / 448.0))
    r = round_to_format(v / scale[:, None], 448.0, -6, 3) * scale[:, None]
    tl.store(ptrs, r.to(x.dtype), mask=mask)


@triton.jit
def _indexer_kernel(x_ptr, rows_ptr, out_ptr, h_ptr, num_rows, stride_x, stride_out,
                    D: tl.constexpr, BLOCK_M: tl.constexpr, GATHER: tl.constexpr,
                    PDL: tl.constexpr):
    pdl_enter(PDL)
    i = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = i < num_rows
    # the rows read and written: the pool rows named (in place) or the i-th (a new tensor)
    row = tl.load(rows_ptr + i, mask=ok, other=0).to(tl.int64) if GATHER else i.to(tl.int64)
    ok = ok & (row >= 0)  # a negative pool row: skipped
    row = tl.maximum(row, 0)
    cols = tl.arange(0, D)
    x = tl.load(x_ptr + row[:, None] * stride_x + cols[None, :], mask=ok[:, None], other=0.0)
    h = tl.load(h_ptr + cols[:, None] * D + cols[None, :])
    y = tl.dot(x.to(tl.float32), h, input_precision="ieee")
    y = y.to(x.dtype).to(tl.float32)  # the rotation's output in the model's dtype, as the ref
    blocks = tl.reshape(y, (BLOCK_M, D // 32, 32))
    amax = tl.maximum(tl.max(tl.abs(blocks), axis=2), 6.0 * 1.1754943508222875e-38)
    scale = pow2_ceil(amax * (1.0 / 6.0))
    r = round_to_format(blocks / scale[:, :, None], 6.0, 0, 1) * scale[:, :, None]
    r = tl.reshape(r, (BLOCK_M, D))
    tl.store(out_ptr + row[:, None] * stride_out + cols[None, :], r.to(x.dtype), mask=ok[:, None])


def fp8_round_rows_triton(pool: torch.Tensor, rows: torch.Tensor, rope_dims: int) -> None:
    """`fp8_round_rows_ref`: pool [R, D] (rows contiguous), rows [N] int."""
    nope = pool.shape[-1] - rope_dims
    if nope % FP8_BLOCK or pool.stride(-1) != 1:
        raise ValueError(f"FP8 rounding takes rows whose {nope} non-rotary values are whole "
                         f"blocks of {FP8_BLOCK}, contiguous")
    if rows.numel() == 0:
        return
    blocks = triton.next_power_of_2(nope // FP8_BLOCK)
    _fp8_rows_kernel[(rows.numel(),)](pool, rows, pool.stride(0), NOPE=nope, BLOCKS=blocks,
                                      BLOCK=FP8_BLOCK, **pdl_launch(pool))


def _indexer_launch(x: torch.Tensor, rows: torch.Tensor | None, out: torch.Tensor) -> None:
    d = x.shape[-1]
    if d % FP4_BLOCK or d & (d - 1) or x.stride(-1) != 1:
        raise ValueError(f"the indexer's rounding takes contiguous rows of a power-of-two "
                         f"multiple of {FP4_BLOCK} values, got {d}")
    n = x.shape[0] if rows is None else rows.numel()
    if n == 0:
        return
    block_m = 16
    _indexer_kernel[(triton.cdiv(n, block_m),)](
        x, x if rows is None else rows, out, hadamard_matrix(d, x.device), n, x.stride(0),
        out.stride(0), D=d, BLOCK_M=block_m, GATHER=rows is not None, **pdl_launch(x))


def indexer_round_triton(x: torch.Tensor) -> torch.Tensor:
    """`indexer_round_ref` over the rows of x [..., d]."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty_like(flat)
    _indexer_launch(flat, None, out)
    return out.view(x.shape)


def indexer_round_rows_triton(pool: torch.Tensor, rows: torch.Tensor) -> None:
    """`indexer_round_rows_ref`: pool [R, d], rows [N] int, in place."""
    _indexer_launch(pool, rows, pool)
