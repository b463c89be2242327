# mypy: disable-error-code="no-untyped-def"
"""FP8 block-scaled linear layers with bf16 (or fp32) activations: the weight stays e4m3 in
memory and is dequantized in registers, so the result is `x @ dequant(w).T` up to summation
order (e4m3 times a power of two is exact in bf16 and fp32). The block scales are E8M0 bytes
(DeepSeek's powers of two) or float32 multipliers (HF's `weight_scale_inv`), a constexpr
switch (E8M0): a float scale multiplies fp32 partial sums of one scale block, never a
weight rounded to the activations' dtype, so the result is still `x @ dequant(w).T` in fp32.

A program owns BLOCK_N weight rows, BLOCK_M activation rows and a 1/SPLIT_K share of K. One
activation row (decode) multiplies on the CUDA cores, BLOCK_K up to 512 bytes of each weight
row per step, so enough bytes are in flight to stream the weight at the bandwidth floor; more
rows use `tl.dot` with the weight tile as the left operand (its rows fill the MMA's 64-row
side, the few activation rows its narrow side): both paths' K steps are `steps.py`'s. With
SPLIT_K > 1 the shares land in an fp32 workspace, added in a fixed order (the same bits every
run) by the last share of each output block to arrive (`split_k.sum_if_last`), or by
`sum_slices`, a second launch, with OPENINFER_SPLIT_SUM=kernel or inside a CUDA-graph capture
that would make the arrival counts.

Two fused forms save a decode step's launches. The gated one (`fp8_block_linear_silu_mul`, a
gated MLP's [gate; up] weight) gives each program gate rows n and the up rows n + I beside
them and writes silu(gate) * up; split, each program's shares hold its gate and up columns
and the sum applies silu * mul. The add + norm one (`fp8_block_linear_add_rms_norm`) hands a
split product's shares to the norm kernel, which sums them in the same order as `sum_slices`.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from openinfer_kernels import split_k
from openinfer_kernels.activation.triton import silu_mul
from openinfer_kernels.device import sm_count
from openinfer_kernels.dot import dot_options
from openinfer_kernels.fp8_linear.steps import _fold_step, _rows1, _step_tiles, _tiles
from openinfer_kernels.norm.triton import (
    fused_add_rms_norm_triton,
    split_sum_add_rms_norm_triton,
)
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

BLOCK = 128  # the FP8 scale block, both ways
# E8M0 (as bytes or float8_e8m0fnu) or float32 multipliers.
SCALE_DTYPES = (torch.uint8, torch.float8_e8m0fnu, torch.float32)
LINE = tl.constexpr(LINE_BYTES)  # e4m3 elements in an L2 line: one byte each
# OPENINFER_PDL_PRELOAD names it; read once. One K step loaded before the wait: two measured
# slower on the H100 (Qwen3-8B kept FP8 batch-1 TPOT 3.84 against 3.59 ms), the registers
# they hold taken from the loop.
PRELOAD = preloads("fp8")


@dataclass(frozen=True, slots=True)
class Fp8Tile:
    """BLOCK_M = 1 takes the CUDA-core path (any BLOCK_K that is a power of two); otherwise
    BLOCK_K divides 128, so a K step sits inside one scale block. `block_n`: the weight rows a
    program reads (the gated product's unsplit programs: half gate rows, half up rows)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


# M follows the batch size: not specialized, so every CUDA-graph size shares one variant.
@triton.jit(do_not_specialize=["M"])
def _fp8_linear_kernel(x_ptr, w_ptr, s_ptr, out_ptr, final_ptr, count_ptr, M, N, K, stride_xm,
                       stride_wn, stride_sn, k_per_split, rows_per_group, stride_xg,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       SUB: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                       E8M0: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr = 0,
                       GATED: tl.constexpr = False, SERIAL: tl.constexpr = False,
                       LIMIT: tl.constexpr = 0.0, PRELOAD: tl.constexpr = False):
    """out[split, m, n] (row-major, [M, N] when not split) for one tile and K share. Grouped
    (`fp8_grouped_linear`): weight rows g * rows_per_group.. take activations x + g * stride_xg
    (a tile never straddles groups); one group: rows_per_group = N. PREFETCH: lines of each
    weight row asked of L2 before `pdl_enter` (by the first block of activation rows).
    GATED (one group): N is the width of silu(gate) * up, gate row n's up row is n + N, and
    out[m, n] = silu(gate) * up (LIMIT > 0: clamped first, `silu_mul`); split, the shares are
    [split, M, 2N], each program's gate and up columns. SERIAL (split): the output block's last
    share to arrive sums the shares into `final_ptr` [M, N] (`split_k.sum_if_last`; gated, the
    sum's silu(gate) * up); `count_ptr`: the arrival counts, zeros before and after.
    PRELOAD (BLOCK_M = 1): the first K step's weight tiles and scales (both, gated) loaded
    before `pdl_enter`; the same sums in the same order."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    x_ptr += ((pid_n * BLOCK_N) // rows_per_group).to(tl.int64) * stride_xg
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    # PREFETCH is set only where PDL is on: the weights, never the previous kernel's output.
    prefetch_rows(w_ptr, rn, n_ok & (pid_m == 0), k_start, k_end, stride_wn, PREFETCH, LINE)
    if GATED:
        prefetch_rows(w_ptr, rn + N, n_ok & (pid_m == 0), k_start, k_end, stride_wn, PREFETCH,
                      LINE)
    # The one-row path's weight and scale rows (gated: u and t, the up rows').
    w_rows = w_ptr + rn[:, None].to(tl.int64) * stride_wn
    s_rows = s_ptr + (rn // 128)[:, None] * stride_sn
    u_rows = w_ptr + (rn + N)[:, None].to(tl.int64) * stride_wn
    t_rows = s_ptr + ((rn + N) // 128)[:, None] * stride_sn
    # The weights and scales, never the previous kernel's output.
    if PRELOAD:
        w0, s0, u0, t0 = _step_tiles(w_rows, s_rows, u_rows, t_rows, n_ok, k_start, k_end,
                                     BLOCK_K, SUB, E8M0, GATED)
    pdl_enter(PDL)
    if BLOCK_M == 1:
        x_row = x_ptr + pid_m * stride_xm
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        first = k_start + BLOCK_K if PRELOAD else k_start
        if PRELOAD:
            acc = _fold_step(acc, w0, s0, x_row, k_start, k_end, BLOCK_N, BLOCK_K, SUB)
        acc = _rows1(acc, x_row, w_rows, s_rows, n_ok, first, k_end, BLOCK_N, BLOCK_K, SUB,
                     E8M0)
        if GATED:
            up = tl.zeros([BLOCK_N], dtype=tl.float32)
            if PRELOAD:
                up = _fold_step(up, u0, t0, x_row, k_start, k_end, BLOCK_N, BLOCK_K, SUB)
            up = _rows1(up, x_row, u_rows, t_rows, n_ok, first, k_end, BLOCK_N, BLOCK_K, SUB,
                        E8M0)
            if SERIAL:  # this share's gate and up columns; the last share gates the sum
                out = out_ptr + (split * M + pid_m).to(tl.int64) * (2 * N) + rn
                tl.store(out + N, up, mask=n_ok)
            else:
                acc = silu_mul(acc, up, out_ptr.dtype.element_ty, LIMIT)
                out = out_ptr + (split * M + pid_m).to(tl.int64) * N + rn
        else:
            out = out_ptr + (split * M + pid_m).to(tl.int64) * N + rn
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_ok)
        if SERIAL:
            rm1 = pid_m + tl.arange(0, 1)
            sum_if_last(out_ptr, final_ptr, count_ptr + pid_m * tl.num_programs(0) + pid_n,
                        rm1, rn, (rm1 < M)[:, None] & n_ok[None, :], M, N,
                        2 * N if GATED else N, N, tl.num_programs(2), GATED, 1, BLOCK_N, LIMIT)
    else:
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = rm < M
        acc2 = _tiles(x_ptr, w_ptr, s_ptr, rn, n_ok, rm, m_ok, k_start, k_end, stride_xm,
                      stride_wn, stride_sn, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, UPCAST,
                      E8M0)
        width = 2 * N if GATED and SERIAL else N  # gated shares: gate and up columns
        out2 = out_ptr + (split * M + rm[None, :]).to(tl.int64) * width + rn[:, None]
        if GATED:
            up2 = _tiles(x_ptr, w_ptr, s_ptr, rn + N, n_ok, rm, m_ok, k_start, k_end,
                         stride_xm, stride_wn, stride_sn, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION,
                         UPCAST, E8M0)
            if SERIAL:
                tl.store(out2 + N, up2, mask=n_ok[:, None] & m_ok[None, :])
            else:
                acc2 = silu_mul(acc2, up2, out_ptr.dtype.element_ty, LIMIT)
        tl.store(out2, acc2.to(out_ptr.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])
        if SERIAL:
            sum_if_last(out_ptr, final_ptr, count_ptr + pid_m * tl.num_programs(0) + pid_n,
                        rm, rn, m_ok[:, None] & n_ok[None, :], M, N, width, N,
                        tl.num_programs(2), GATED, BLOCK_M, BLOCK_N, LIMIT)


@triton.jit
def _sum_slices_kernel(part_ptr, out_ptr, ROWS, COLS, stride_s, stride_r, SLICES: tl.constexpr,
                       BLOCK: tl.constexpr, PDL: tl.constexpr, GATED: tl.constexpr = False,
                       LIMIT: tl.constexpr = 0.0):
    pdl_enter(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < ROWS * COLS
    row = offs // COLS
    col = offs % COLS
    total = tl.zeros([BLOCK], dtype=tl.float32)
    up = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SLICES):  # a fixed order: the same sum every run
        slot = part_ptr + s * stride_s + row * stride_r + col
        total += tl.load(slot, mask=ok, other=0.0)
        if GATED:
            up += tl.load(slot + COLS, mask=ok, other=0.0)
    if GATED:
        total = silu_mul(total, up, out_ptr.dtype.element_ty, LIMIT)
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=ok)


def sum_slices(part: torch.Tensor, out: torch.Tensor, slices: int, stride_s: int,
               stride_r: int, gated: bool = False, limit: float = 0.0) -> None:
    """out [R, C] contiguous = sum over s < slices of part[s * stride_s + r * stride_r + c]
    (fp32 elements), added in the order of s; `gated`: silu of that sum times the same sum
    of the up column C columns after it, rounded as `silu_and_mul` rounds (`limit` > 0: both
    clamped first, `silu_mul`)."""
    rows, cols = out.shape
    block = 1024
    _sum_slices_kernel[(triton.cdiv(rows * cols, block),)](
        part, out, rows, cols, stride_s, stride_r, SLICES=slices, BLOCK=block, GATED=gated,
        LIMIT=limit, **pdl_launch(out))


def fp8_tile(m: int, n: int, k: int, dtype: torch.dtype, sms: int) -> Fp8Tile:
    """The tile by row count, from the weight-only sweep at Qwen3-8B's shapes on an H100
    (benchmarks/device/fp8_gemm.py --decode-sweep): one row on the CUDA cores, 16 weight rows
    by 512 bytes a step, K split until there are about eight programs per SM (split 4 for the
    4096-row products, none for the wide ones); 2-16 rows on 16 x 64 MMA tiles with K in four
    shares (10-20% faster than two); 128-wide tiles past 32 rows, K split until there are about
    two programs per SM."""
    if m == 1:
        bm, bn, bk, warps, stages, per_sm = 1, 16, 512, 4, 3, 8
    elif m <= 16:
        bm, bn, bk, warps, stages, per_sm = 16, 64, 128, 4, 3, 0
    elif m <= 32:
        bm, bn, bk, warps, stages, per_sm = 32, 64, 128, 4, 4, 2
    else:
        bm, bn, bk, warps, stages, per_sm = (64 if m <= 64 else 128), 128, 128, 8, 3, 2
    if dtype == torch.float32 and bm > 1:  # fp32 tiles take twice the shared memory
        bk, stages = 64, 2
    programs = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    want = 4 if per_sm == 0 else per_sm * sms // programs
    split = max(1, min(triton.cdiv(k, bk), want))
    return Fp8Tile(bm, bn, bk, split, warps, stages)


def _check(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> None:
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or x.stride(1) != 1:
        raise ValueError(f"fp8_block_linear: x [M, K] (K contiguous) and w [N, K], got x "
                         f"{tuple(x.shape)} strides {x.stride()}, w {tuple(w.shape)}")
    if w.dtype != torch.float8_e4m3fn or not w.is_contiguous():
        raise ValueError(f"fp8_block_linear: w must be contiguous float8_e4m3fn, got {w.dtype}")
    check_block_scales("fp8_block_linear", w, scale)


def check_block_scales(op: str, w: torch.Tensor, scale: torch.Tensor) -> None:
    """`scale` holds one E8M0 byte or float32 per 128 x 128 block of `w`, rows contiguous."""
    want = (triton.cdiv(w.shape[0], BLOCK), triton.cdiv(w.shape[1], BLOCK))
    if (tuple(scale.shape) != want or scale.dtype not in SCALE_DTYPES
            or scale.stride(-1) != 1):
        raise ValueError(f"{op}: scale must be E8M0 bytes or float32 of shape {want} (last "
                         f"dim contiguous), got {scale.dtype} {tuple(scale.shape)}")


def fp8_block_linear_triton(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                            out_dtype: torch.dtype | None = None,
                            tile: Fp8Tile | None = None) -> torch.Tensor:
    """x [M, K] bf16/fp32 (K contiguous), w [N, K] float8_e4m3fn contiguous, scale
    [ceil(N/128), ceil(K/128)] E8M0 (uint8 or float8_e8m0fnu) or float32 -> [M, N] in `out_dtype`
    (default x's); `tile` overrides the heuristic (benchmarks)."""
    _check(x, w, scale)
    (m, k), n = x.shape, w.shape[0]
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if m == 0:
        return out
    _launch(x, w, scale, out, tile or fp8_tile(m, n, k, x.dtype, sm_count(x.device)), n, 0)
    return out


def fp8_block_linear_silu_mul_triton(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                                     tile: Fp8Tile | None = None,
                                     limit: float | None = None) -> torch.Tensor:
    """`silu_and_mul(fp8_block_linear_triton(x, w, scale))` for a gated MLP's [gate; up]
    weight (w [2I, K]) -> [M, I] in x's dtype, in one launch (split, the last share per
    output block sums the shares and applies silu * mul; `sum_slices` does, a second launch,
    where `_launch` says). `tile`: as `fp8_block_linear` picks for [2I, K]
    when not given; unsplit, a program's block_n rows are half gate rows, half up rows.
    `limit` (finite, > 0): the gate clamped to at most it and up to +-it first (a clamped
    SwiGLU, as `fp8_block_linear_silu_mul_ref` with the same limit)."""
    _check(x, w, scale)
    (m, k), rows = x.shape, w.shape[0]
    if rows % 2:
        raise ValueError(f"fp8_block_linear_silu_mul: w must be [gate; up], an even number "
                         f"of rows, got {tuple(w.shape)}")
    tile = tile or fp8_tile(m, rows, k, x.dtype, sm_count(x.device))
    if tile.block_m > 1 and tile.block_n < 32:  # each half's tl.dot needs 16 rows
        raise ValueError(f"fp8_block_linear_silu_mul: a tl.dot tile needs block_n >= 32 (16 "
                         f"gate and 16 up rows), got {tile}")
    out = torch.empty((m, rows // 2), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    clamp = float(limit) if limit is not None and 0 < limit < float("inf") else 0.0
    _launch(x, w, scale, out, tile, rows, 0, gated=True, limit=clamp)
    return out


def fp8_block_linear_add_rms_norm_triton(x: torch.Tensor, w: torch.Tensor,
                                         scale: torch.Tensor, residual: torch.Tensor,
                                         norm_weight: torch.Tensor, eps: float,
                                         tile: Fp8Tile | None = None
                                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """`fused_add_rms_norm(fp8_block_linear_triton(x, w, scale), residual, norm_weight, eps)`
    -> (normed, summed), x's dtype. Where the tile splits K, the norm kernel sums the fp32
    shares in `sum_slices`'s order and rounds the sum as the linear would: one launch fewer,
    the same numbers. `tile`: as `fp8_block_linear` picks when not given."""
    _check(x, w, scale)
    (m, k), n = x.shape, w.shape[0]
    if residual.shape != (m, n) or norm_weight.shape != (n,):
        raise ValueError(f"fp8_block_linear_add_rms_norm: residual must be [{m}, {n}] and "
                         f"norm_weight [{n}], got {tuple(residual.shape)} and "
                         f"{tuple(norm_weight.shape)}")
    tile = tile or fp8_tile(m, n, k, x.dtype, sm_count(x.device))
    k_per_split, split = _shares(k, tile)
    if split == 1 or m == 0 or residual.dtype != x.dtype:
        return fused_add_rms_norm_triton(fp8_block_linear_triton(x, w, scale, tile=tile),
                                         residual, norm_weight, eps)
    shares = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    _launch_shares(x, w, scale, shares, tile, k_per_split, split, n, 0)
    return split_sum_add_rms_norm_triton(shares, residual, norm_weight, eps)


def fp8_grouped_linear_triton(x: torch.Tensor, w: torch.Tensor,
                              scale: torch.Tensor) -> torch.Tensor:
    """`fp8_grouped_linear_ref`'s contract in one launch (two when K is split): x [M, G, K]
    (K contiguous), w [G R, K] float8_e4m3fn contiguous with R a multiple of 128, scale its
    blocks (E8M0 or float32) -> [M, G, R] in x's dtype. Each group's tile and K split are what
    `fp8_block_linear` picks for one group alone, so the result is that of G such calls."""
    if x.dim() != 3 or w.shape[0] % (x.shape[1] * BLOCK):
        raise ValueError(f"fp8_grouped_linear: need x [M, G, K] and w [G R, K] with R a "
                         f"multiple of {BLOCK}; got x {tuple(x.shape)}, w {tuple(w.shape)}")
    (m, groups, k), n = x.shape, w.shape[0]
    _check(x[:, 0], w, scale)
    out = torch.empty((m, groups, n // groups), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    rows = n // groups
    tile = fp8_tile(m, rows, k, x.dtype, sm_count(x.device))
    if rows % tile.block_n:
        raise ValueError(f"fp8_grouped_linear: {rows} rows a group do not fill whole tiles")
    _launch(x, w, scale, out.view(m, n), tile, rows, x.stride(1))
    return out


def _shares(k: int, tile: Fp8Tile) -> tuple[int, int]:
    """(K columns a share, shares) for `tile`: whole K steps a share, no empty shares."""
    k_per_split = triton.cdiv(triton.cdiv(k, tile.split_k), tile.block_k) * tile.block_k
    return k_per_split, triton.cdiv(k, k_per_split)


def _launch(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor,
            tile: Fp8Tile, rows_per_group: int, stride_xg: int, gated: bool = False,
            limit: float = 0.0) -> None:
    """out [M, N] contiguous = x W^T (`gated`: [M, N / 2], silu(gate) * up of W = [gate; up]);
    grouped when rows_per_group < N. Split, the fp32 shares, summed by the kernel's last
    share per output block (`split_k`; gated, each program's shares hold its gate and its up
    columns, so the last one gates the sum) or, with `OPENINFER_SPLIT_SUM=kernel` or inside
    a capture that would make the arrival counts, by `sum_slices`."""
    m, n = x.shape[0], w.shape[0]
    k_per_split, split = _shares(x.shape[-1], tile)
    if split == 1:
        _launch_shares(x, w, scale, out, tile, k_per_split, split, rows_per_group, stride_xg,
                       gated, limit=limit)
        return
    shares = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    block_n = tile.block_n // 2 if gated else tile.block_n
    blocks = triton.cdiv(n // 2 if gated else n, block_n) * triton.cdiv(m, tile.block_m)
    counts = split_k.counts_for(x.device, blocks) if split_k.SERIAL_SUM else None
    if counts is not None:
        _launch_shares(x, w, scale, shares, tile, k_per_split, split, rows_per_group,
                       stride_xg, gated, serial=(out, counts), limit=limit)
        return
    _launch_shares(x, w, scale, shares, tile, k_per_split, split, rows_per_group, stride_xg)
    sum_slices(shares, out, split, m * n, n, gated, limit)


def _launch_shares(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                   target: torch.Tensor, tile: Fp8Tile, k_per_split: int, split: int,
                   rows_per_group: int, stride_xg: int, gated: bool = False,
                   serial: tuple[torch.Tensor, torch.Tensor] | None = None,
                   limit: float = 0.0) -> None:
    """The kernel into `target`: [M, N] (`gated`: [M, N / 2], a program reading block_n / 2
    gate rows and as many up rows) when split == 1, else the fp32 shares [split, M, N];
    `serial`: (the [M, N] output, the arrival counts) for the last share to sum into."""
    m, k = x.shape[0], x.shape[-1]
    n = w.shape[0] // 2 if gated else w.shape[0]
    block_n = tile.block_n // 2 if gated else tile.block_n
    e8m0 = scale.dtype != torch.float32
    s = scale.view(torch.uint8) if e8m0 else scale
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, tile.block_m), split)
    pdl = pdl_launch(x)
    prefetch = 0
    preload = pdl["PDL"] and tile.block_m == 1 and PRELOAD
    if pdl["PDL"] and not preload:  # e4m3: a byte an element
        prefetch = prefetch_lines(w.shape[0], 1, k_per_split, split, tile.block_n,
                                  PREFETCH_BUDGET)
    final, counts = serial if serial is not None else (target, target)
    _fp8_linear_kernel[grid](x, w, s, target, final, counts, m, n, k, x.stride(0), w.stride(0),
                             s.stride(0), k_per_split, rows_per_group, stride_xg,
                             BLOCK_M=tile.block_m,
                             BLOCK_N=block_n, BLOCK_K=tile.block_k,
                             SUB=min(tile.block_k, BLOCK), E8M0=e8m0,
                             **dot_options(x), num_warps=tile.num_warps,
                             num_stages=tile.num_stages, PREFETCH=prefetch, GATED=gated,
                             SERIAL=serial is not None, LIMIT=limit, PRELOAD=preload, **pdl)
