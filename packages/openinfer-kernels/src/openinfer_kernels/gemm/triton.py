# mypy: disable-error-code="no-untyped-def"
"""Small-batch linear layers (M <= 32 rows): at batch 1 to 32 a decode step's GEMMs only stream
their weights, so the kernels are built to keep enough weight bytes in flight rather than for
FLOPs. A program owns BLOCK_N output columns (weight rows) and a 1/SPLIT_K share of K, and
streams [BLOCK_N, BLOCK_K] weight tiles; with SPLIT_K > 1 the shares land in an fp32 workspace
and are added in a fixed order, so results do not depend on timing: by the last of a column
block's programs to finish (`split_k.sum_if_last`), or, with `OPENINFER_SPLIT_SUM=kernel`, by a
second kernel (one launch more: at batch 1 a launch costs about what a small shard's product
does).
M = 1 multiplies on the CUDA cores (a row dot per column); larger M pads the rows to 16 and
uses `tl.dot`. The gated form computes an MLP's gate and up columns side by side and writes
silu(gate) * up, so the [M, 2I] product never goes to memory. (The mypy line above:
@triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from openinfer_kernels import split_k
from openinfer_kernels.activation.triton import silu_mul
from openinfer_kernels.dot import dot, dot_options
from openinfer_kernels.pdl import (
    LINE_BYTES,
    PREFETCH_BUDGET,
    pdl_enter,
    pdl_launch,
    prefetch_lines,
    prefetch_rows,
    preloads,
)
from openinfer_kernels.split_k import sum_if_last

PRELOAD = preloads("linear")  # OPENINFER_PDL_PRELOAD names it; read once


@dataclass(frozen=True, slots=True)
class Tile:
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4


@triton.jit
def row_product(x_ptr, w_ptr, rn, n_ok, k_start, k_end, stride_wn, acc,
                BLOCK_K: tl.constexpr):
    """`acc` ([BLOCK_N] fp32) plus x's one row times weight rows `rn` over K in
    [k_start, k_end), a BLOCK_K tile at a time in order."""
    for k in range(k_start, k_end, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        k_ok = rk < k_end
        w = tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :],
                    mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_ptr + rk, mask=k_ok, other=0.0)
        acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    return acc


@triton.jit
def first_tile(w_ptr, rn, n_ok, k_start, k_end, stride_wn, BLOCK_K: tl.constexpr):
    """Weight rows `rn`'s first BLOCK_K columns from k_start (none past k_end): a tile that
    `preloaded_product` takes, loaded before the kernel's PDL wait."""
    rk = k_start + tl.arange(0, BLOCK_K)
    return tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :],
                   mask=n_ok[:, None] & (rk < k_end)[None, :], other=0.0)


@triton.jit
def preloaded_product(x_ptr, w_ptr, w0, rn, n_ok, k_start, k_end, stride_wn,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """`partial_product` at M = 1 whose first tile `w0` (`first_tile`) is at hand: the same
    sum in the same order, so the same bits."""
    rk = k_start + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + rk, mask=rk < k_end, other=0.0)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc += tl.sum(w0.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    acc = row_product(x_ptr, w_ptr, rn, n_ok, k_start + BLOCK_K, k_end, stride_wn, acc,
                      BLOCK_K)
    return acc[None, :]


@triton.jit
def partial_product(x_ptr, w_ptr, rn, n_ok, rm, M, k_start, k_end, stride_xm, stride_wn,
             M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """[M_PAD, BLOCK_N] fp32: rows `rm` of x times weight rows `rn`, over K in
    [k_start, k_end)."""
    if M_PAD == 1:
        acc = row_product(x_ptr, w_ptr, rn, n_ok, k_start, k_end, stride_wn,
                          tl.zeros([BLOCK_N], dtype=tl.float32), BLOCK_K)
        return acc[None, :]
    else:
        acc2 = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
        for k in range(k_start, k_end, BLOCK_K):
            rk = k + tl.arange(0, BLOCK_K)
            k_ok = rk < k_end
            w = tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :],
                        mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :],
                        mask=(rm < M)[:, None] & k_ok[None, :], other=0.0)
            acc2 += dot(x, tl.trans(w), PRECISION, UPCAST)
        return acc2


# M follows the batch size: not specialized on (1, multiples of 16), so every CUDA-graph size
# of up to 16 rows shares its tile's one compiled variant.
@triton.jit(do_not_specialize=["M"])
def _linear_kernel(x_ptr, w_ptr, out_ptr, final_ptr, count_ptr, M, N, K, stride_xm,
                   stride_wn, stride_om, k_per_split, M_PAD: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                   GATED: tl.constexpr, SERIAL: tl.constexpr, PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr = 0,
                   LINE: tl.constexpr = 64, PRELOAD: tl.constexpr = False):
    """Output columns [pid_n * BLOCK_N, +BLOCK_N) of one K share. GATED: N is the width of
    silu(gate) * up, the gate's weight rows first and the up rows N rows after them.
    SERIAL (split): the block's last share to arrive sums the workspace into `final_ptr`
    ([M, N], row stride stride_om); `count_ptr`: the arrival counts, zeros before and after.
    PREFETCH: lines (LINE elements) of each weight row asked of L2 before `pdl_enter`.
    PRELOAD (M = 1 only): the first weight tile of each product loaded before `pdl_enter`."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, M_PAD)
    n_ok = rn < N
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    # PREFETCH is set only where PDL is on: the weights, never the previous kernel's output.
    prefetch_rows(w_ptr, rn, n_ok, k_start, k_end, stride_wn, PREFETCH, LINE)
    if GATED:
        prefetch_rows(w_ptr + N * stride_wn, rn, n_ok, k_start, k_end, stride_wn, PREFETCH,
                      LINE)
    if PRELOAD:  # the weights, never the previous kernel's output
        w0 = first_tile(w_ptr, rn, n_ok, k_start, k_end, stride_wn, BLOCK_K)
        if GATED:
            u0 = first_tile(w_ptr + N * stride_wn, rn, n_ok, k_start, k_end, stride_wn, BLOCK_K)
    pdl_enter(PDL)
    if PRELOAD:
        first = preloaded_product(x_ptr, w_ptr, w0, rn, n_ok, k_start, k_end, stride_wn,
                                  BLOCK_N, BLOCK_K)
    else:
        first = partial_product(x_ptr, w_ptr, rn, n_ok, rm, M, k_start, k_end, stride_xm,
                                stride_wn, M_PAD, BLOCK_N, BLOCK_K, PRECISION, UPCAST)
    mask = (rm < M)[:, None] & n_ok[None, :]
    if GATED:
        if PRELOAD:
            second = preloaded_product(x_ptr, w_ptr + N * stride_wn, u0, rn, n_ok, k_start,
                                       k_end, stride_wn, BLOCK_N, BLOCK_K)
        else:
            second = partial_product(x_ptr, w_ptr + N * stride_wn, rn, n_ok, rm, M, k_start,
                                     k_end, stride_xm, stride_wn, M_PAD, BLOCK_N, BLOCK_K,
                                     PRECISION, UPCAST)
        if SPLIT_K == 1:
            first = silu_mul(first, second, out_ptr.dtype.element_ty)
        else:  # the workspace row is [gate | up], 2N wide
            tl.store(out_ptr + (split * M + rm[:, None]) * 2 * N + N + rn[None, :], second,
                     mask=mask)
    if SPLIT_K == 1:
        tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :],
                 first.to(out_ptr.dtype.element_ty), mask=mask)
    else:  # out_ptr is the fp32 workspace [SPLIT_K, M, N or 2N]
        width = 2 * N if GATED else N
        tl.store(out_ptr + (split * M + rm[:, None]) * width + rn[None, :], first, mask=mask)
        if SERIAL:
            sum_if_last(out_ptr, final_ptr, count_ptr + pid_n, rm, rn, mask, M, N, width,
                        stride_om, SPLIT_K, GATED, M_PAD, BLOCK_N)


@triton.jit
def _sum_splits_kernel(part_ptr, out_ptr, MN, N, stride_om, SPLIT_K: tl.constexpr,
                       GATED: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    m = offs // N
    n = offs % N
    width = 2 * N if GATED else N
    total = tl.zeros([BLOCK], dtype=tl.float32)
    up = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT_K):  # a fixed order: the same sum every run
        row = part_ptr + (s * (MN // N) + m) * width
        total += tl.load(row + n, mask=ok, other=0.0)
        if GATED:
            up += tl.load(row + N + n, mask=ok, other=0.0)
    if GATED:
        total = silu_mul(total, up, out_ptr.dtype.element_ty)
    tl.store(out_ptr + m * stride_om + n, total.to(out_ptr.dtype.element_ty), mask=ok)


def linear_add_rms_norm_triton(x: torch.Tensor, w: torch.Tensor, tile: Tile,
                               residual: torch.Tensor, norm_weight: torch.Tensor,
                               eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`fused_add_rms_norm(linear_triton(x, w, tile), residual, norm_weight, eps)` for a split-K
    tile: the norm kernel sums the shares, so the split sum needs no launch of its own."""
    from openinfer_kernels.norm.triton import split_sum_add_rms_norm_triton

    return split_sum_add_rms_norm_triton(linear_shares_triton(x, w, tile), residual,
                                         norm_weight, eps)


def linear_shares_triton(x: torch.Tensor, w: torch.Tensor, tile: Tile) -> torch.Tensor:
    """The K shares of `linear_triton(x, w, tile)` for a split-K tile, unsummed: fp32
    [split, M, N], whose sum in share order rounded to x's dtype is its result (`sum_shares_
    triton`, or a kernel that sums them itself: the push all-reduce's)."""
    m, n = x.shape[0], w.shape[0]
    if tile.split_k < 2 or m > 32 or x.stride(1) != 1 or not w.is_contiguous():
        raise ValueError(f"a linear's shares: need a split-K tile, M <= 32 and K-contiguous "
                         f"operands; got {tile}, x {tuple(x.shape)} strides {x.stride()}")
    shares = torch.empty((tile.split_k, m, n), dtype=torch.float32, device=x.device)
    _launch_linear(x, w, shares, shares, tile, gated=False)
    return shares


def sum_shares_triton(shares: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[S, M, N] fp32 shares summed in share order and rounded to `dtype`: [M, N]."""
    split, m, n = shares.shape
    out = torch.empty((m, n), dtype=dtype, device=shares.device)
    if out.numel():
        block = 1024
        _sum_splits_kernel[(triton.cdiv(m * n, block),)](shares, out, m * n, n, out.stride(0),
                                                         SPLIT_K=split, GATED=False,
                                                         BLOCK=block, **pdl_launch(shares))
    return out


def _launch_linear(x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, out: torch.Tensor,
                   tile: Tile, gated: bool, serial: bool = False) -> bool:
    """The linear kernel into `target`: `out` itself ([M, N]) or, split K ways, the fp32
    shares [split, M, N or 2N]; `serial`: the last share of each column block also sums them
    into `out`. Whether the launch left the shares for another kernel to sum."""
    m, k = x.shape
    n = w.shape[0] // 2 if gated else w.shape[0]
    m_pad = 1 if m == 1 else 16 if m <= 16 else 32
    split = tile.split_k
    k_per_split = triton.cdiv(triton.cdiv(k, split), tile.block_k) * tile.block_k
    grid = (triton.cdiv(n, tile.block_n), split)
    pdl = pdl_launch(x)
    prefetch = 0
    preload = pdl["PDL"] and m_pad == 1 and PRELOAD
    if pdl["PDL"] and not preload:
        prefetch = prefetch_lines(w.shape[0], w.element_size(), k_per_split, split,
                                  tile.block_n * (2 if gated else 1), PREFETCH_BUDGET)
    counts = split_k.counts_for(x.device, grid[0]) if serial and split > 1 else None
    serial = counts is not None
    _linear_kernel[grid](x, w, target, out, target if counts is None else counts, m, n, k,
                         x.stride(0), w.stride(0), out.stride(-2), k_per_split, M_PAD=m_pad,
                         BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, SPLIT_K=split,
                         GATED=gated, SERIAL=serial,
                         **dot_options(x), num_warps=tile.num_warps,
                         num_stages=tile.num_stages, PREFETCH=prefetch,
                         LINE=LINE_BYTES // w.element_size(), PRELOAD=preload, **pdl)
    return split > 1 and not serial


def linear_triton(x: torch.Tensor, w: torch.Tensor, tile: Tile, gated: bool = False,
                  out_dtype: torch.dtype | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [M, K] (M <= 32, last dim contiguous), w: [N, K] contiguous -> [M, N] in `out_dtype`
    (default x's; fp32 stores the accumulator unrounded, as the vocabulary projection wants);
    `gated`: w is [gate; up] ([2I, K]) and the result silu(x @ gate.T) * (x @ up.T), [M, I].
    `out`: the [M, N] result's buffer (rows contiguous), else a new one."""
    m = x.shape[0]
    n = w.shape[0] // 2 if gated else w.shape[0]
    if m > 32 or x.stride(1) != 1 or not w.is_contiguous():
        raise ValueError(f"small-batch linear needs M <= 32 and K-contiguous operands, got "
                         f"x {tuple(x.shape)} strides {x.stride()}")
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    elif out.shape != (m, n) or out.stride(1) != 1:
        raise ValueError(f"small-batch linear: out must be [{m}, {n}] with contiguous rows, "
                         f"got {tuple(out.shape)} strides {out.stride()}")
    split = tile.split_k
    target = out if split == 1 else torch.empty(
        (split, m, 2 * n if gated else n), dtype=torch.float32, device=x.device)
    if _launch_linear(x, w, target, out, tile, gated, serial=split_k.SERIAL_SUM):
        block = 1024
        _sum_splits_kernel[(triton.cdiv(m * n, block),)](target, out, m * n, n, out.stride(0),
                                                         SPLIT_K=split, GATED=gated,
                                                         BLOCK=block, **pdl_launch(x))
    return out
