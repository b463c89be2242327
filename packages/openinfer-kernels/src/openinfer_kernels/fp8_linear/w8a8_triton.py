# mypy: disable-error-code="no-untyped-def"
"""The W8A8 form of the block-FP8 linear, for many rows (prefill): the activations quantized
per row and 128-column group (`fp8_group_quant_triton`), then e4m3 x e4m3 products on the
FP8 tensor cores (`fp8_w8a8_linear_triton`), twice the bf16 MMA rate and no dequantization
in registers. Their references are `fp8_group_quant_ref` and `fp8_w8a8_linear_ref`.

The GEMM steps K by BLOCK_K = 128, one scale block of both operands: each step's fp8 `tl.dot`
(fp32 out) is scaled by act_scale[m, kb] * w_scale[nb, kb] and added to an fp32 accumulator,
so the tensor cores' own accumulation spans one block (Hopper's FP8 MMA keeps fewer bits
than fp32; the per-block promotion bounds what that costs, as in DeepSeek's DeepGEMM). Weight
scales are E8M0 bytes or float32, the constexpr switch of `triton.py`. Programs walk the
output tiles in groups of GROUP_M row tiles (the weight tiles a group reads stay in L2); with
SPLIT_K > 1 the K shares land in an fp32 workspace that `sum_slices` adds in a fixed order.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from openinfer_kernels.activation.triton import silu_mul
from openinfer_kernels.device import sm_count
from openinfer_kernels.dot import dot, dot_options
from openinfer_kernels.e4m3 import round_to_e4m3
from openinfer_kernels.fp8_linear.reference import AMAX_FLOOR, E4M3_MAX, GROUP
from openinfer_kernels.fp8_linear.steps import _block_scales
from openinfer_kernels.fp8_linear.triton import check_block_scales, sum_slices
from openinfer_kernels.pdl import pdl_enter, pdl_launch

QUANT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def quantize_groups(x, AMAX_FLOOR: tl.constexpr, E4M3_MAX: tl.constexpr):
    """fp32 x [R, GROUP] (one 128-column group of R rows) -> (its e4m3 values, in fp32 on the
    e4m3 grid, and the rows' fp32 scales [R]): `fp8_group_quant_ref`'s math (div_rn: the IEEE
    division the reference's is, not the approximate one `/` compiles to). The value is
    rounded to the e4m3 grid in fp32 first, so the cast is exact: compiled for sm90 the fp32 ->
    e4m3 cast gave other bits than torch's on some values (the Qwen3-8B shape tests of
    test_fp8_w8a8.py, H100), and the interpreter's (triton 3.9) does not carry a round-up into
    the exponent (124.3 becomes 64)."""
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), AMAX_FLOOR)
    scale = tl.math.div_rn(amax, tl.full(amax.shape, E4M3_MAX, tl.float32))
    q = tl.math.div_rn(x, tl.broadcast_to(scale[:, None], x.shape))
    q = tl.minimum(tl.maximum(q, -E4M3_MAX), E4M3_MAX)
    return round_to_e4m3(q), scale


@triton.jit(do_not_specialize=["M"])
def _group_quant_kernel(x_ptr, q_ptr, s_ptr, M, K, stride_xm, stride_qm, stride_sm,
                        stride_sk, ROWS: tl.constexpr, GROUP: tl.constexpr,
                        AMAX_FLOOR: tl.constexpr, E4M3_MAX: tl.constexpr,
                        PDL: tl.constexpr, SILU: tl.constexpr = False):
    """ROWS rows x one GROUP-column group: amax, scale, e4m3 values (`quantize_groups`).
    SILU: x's rows are a gated MLP's [gate | up] (2K wide) and the values silu(gate) * up,
    rounded to x's dtype as `_silu_and_mul_kernel` stores them (quant_fused.py's form)."""
    pdl_enter(PDL)
    rm = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    kb = tl.program_id(1)
    rk = kb * GROUP + tl.arange(0, GROUP)
    ok = (rm < M)[:, None] & (rk < K)[None, :]
    rows = rm[:, None].to(tl.int64)
    x = tl.load(x_ptr + rows * stride_xm + rk[None, :], mask=ok, other=0.0)
    if SILU:
        up = tl.load(x_ptr + rows * stride_xm + K + rk[None, :], mask=ok, other=0.0)
        x = silu_mul(x.to(tl.float32), up.to(tl.float32), x.dtype).to(x.dtype)
    q, scale = quantize_groups(x.to(tl.float32), AMAX_FLOOR, E4M3_MAX)
    tl.store(q_ptr + rows * stride_qm + rk[None, :], q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + rm * stride_sm + kb * stride_sk, scale, mask=rm < M)


def group_quant_outputs(m: int, k: int, device: torch.device
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (e4m3 [M, K], fp32 scales [M, ceil(K/128)]) as `fp8_group_quant_triton` lays them
    out: the scales M-major (a [ceil(K/128), M] tensor, transposed), so the GEMM reads a tile's
    row scales of one K block from consecutive addresses; both with their rows padded to a
    multiple of 4 in storage: each group's scales start 16-byte aligned, and cuBLASLt's
    block-scaled FP8 product (`scaled_mm.py`) runs on the padded rows, since it takes a scale
    operand only as long as the rows."""
    padded = -(-m // 4) * 4
    q = torch.empty((padded, k), dtype=torch.float8_e4m3fn, device=device)[:m]
    scale = torch.empty((triton.cdiv(k, GROUP), padded), dtype=torch.float32,
                        device=device).t()[:m]
    return q, scale


def fp8_group_quant_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`fp8_group_quant_ref`'s contract: x [M, K] bf16/fp16/fp32 (K contiguous) -> (e4m3
    [M, K], fp32 scales [M, ceil(K/128)]) laid out as `group_quant_outputs` says."""
    if x.dim() != 2 or x.stride(1) != 1 or x.dtype not in QUANT_DTYPES:
        raise ValueError(f"fp8_group_quant: x must be [M, K] bf16, fp16 or fp32 with K "
                         f"contiguous, got {x.dtype} {tuple(x.shape)} strides {x.stride()}")
    m, k = x.shape
    q, scale = group_quant_outputs(m, k, x.device)
    if m == 0 or k == 0:
        return q, scale
    rows = min(32, triton.next_power_of_2(m))
    _group_quant_kernel[(triton.cdiv(m, rows), triton.cdiv(k, GROUP))](
        x, q, scale, m, k, x.stride(0), q.stride(0), scale.stride(0), scale.stride(1),
        ROWS=rows, GROUP=GROUP, AMAX_FLOOR=AMAX_FLOOR, E4M3_MAX=E4M3_MAX,
        num_warps=4, **pdl_launch(x))
    return q, scale


@dataclass(frozen=True, slots=True)
class W8a8Tile:
    """An output tile of BLOCK_M x BLOCK_N (BLOCK_K is 128: one scale block a step); programs
    ordered in groups of GROUP_M row tiles; K split into SPLIT_K shares of whole blocks."""

    block_m: int
    block_n: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


@triton.jit(do_not_specialize=["M"])
def _w8a8_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, out_ptr, M, N, K, stride_am, stride_asm,
                 stride_ask, stride_wn, stride_wsn, k_per_split, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 PRECISION: tl.constexpr, UPCAST: tl.constexpr, E8M0: tl.constexpr,
                 PDL: tl.constexpr):
    """out[split, m, n] (row-major; [M, N] when not split) for one tile and K share."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    a_rows = a_ptr + rm[:, None].to(tl.int64) * stride_am
    w_rows = w_ptr + rn[:, None].to(tl.int64) * stride_wn
    as_rows = as_ptr + rm * stride_asm
    ws_rows = ws_ptr + (rn // BLOCK_K) * stride_wsn
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    pdl_enter(PDL)  # the activations and their scales are the previous kernel's output
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        k_ok = rk < k_end
        a = tl.load(a_rows + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        a_scale = tl.load(as_rows + (k // BLOCK_K) * stride_ask, mask=m_ok, other=0.0)
        w_scale = _block_scales(ws_rows + k // BLOCK_K, n_ok, E8M0)
        part = dot(a, tl.trans(w), PRECISION, UPCAST)
        acc += part * a_scale[:, None] * w_scale[None, :]
    out = out_ptr + (split * M + rm[:, None]).to(tl.int64) * N + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def w8a8_tile(m: int, n: int, k: int, sms: int) -> W8a8Tile:
    """A heuristic tile, not yet tuned (benchmarks/device/fp8_gemm.py times candidates):
    16-row MMA tiles for a few rows, 64 up to 64 rows, 128 x 128 with two warpgroups beyond;
    K split, in whole blocks, while the tiles fill less than one wave of the SMs."""
    if m <= 16:
        bm, bn, warps, stages = 16, 64, 4, 4
    elif m <= 64:
        bm, bn, warps, stages = 64, 128, 4, 4
    else:
        bm, bn, warps, stages = 128, 128, 8, 4
    programs = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    split = max(1, min(triton.cdiv(k, GROUP), sms // programs))
    return W8a8Tile(bm, bn, split, num_warps=warps, num_stages=stages)


def _check(xq: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor,
           scale: torch.Tensor) -> None:
    fp8 = torch.float8_e4m3fn
    if (xq.dim() != 2 or w.dim() != 2 or xq.shape[1] != w.shape[1] or xq.stride(1) != 1
            or xq.dtype != fp8 or w.dtype != fp8 or not w.is_contiguous()):
        raise ValueError(f"fp8_w8a8_linear: xq [M, K] (K contiguous) and w [N, K] "
                         f"(contiguous), both float8_e4m3fn; got xq {xq.dtype} "
                         f"{tuple(xq.shape)} strides {xq.stride()}, w {w.dtype} "
                         f"{tuple(w.shape)}")
    groups = triton.cdiv(w.shape[1], GROUP)
    if tuple(x_scale.shape) != (xq.shape[0], groups) or x_scale.dtype != torch.float32:
        raise ValueError(f"fp8_w8a8_linear: x_scale must be float32 {(xq.shape[0], groups)}, "
                         f"got {x_scale.dtype} {tuple(x_scale.shape)}")
    check_block_scales("fp8_w8a8_linear", w, scale)


def fp8_w8a8_linear_triton(xq: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor,
                           scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16,
                           tile: W8a8Tile | None = None) -> torch.Tensor:
    """`fp8_w8a8_linear_ref`'s contract: xq [M, K] e4m3 (K contiguous) with x_scale [M,
    ceil(K/128)] float32 (any strides), w [N, K] e4m3 contiguous with scale [ceil(N/128),
    ceil(K/128)] E8M0 (uint8 or float8_e8m0fnu) or float32 -> [M, N] in `out_dtype`; `tile`
    overrides the heuristic (benchmarks)."""
    _check(xq, x_scale, w, scale)
    (m, k), n = xq.shape, w.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0:
        return out
    tile = tile or w8a8_tile(m, n, k, sm_count(xq.device))
    k_per_split = triton.cdiv(triton.cdiv(k, tile.split_k), GROUP) * GROUP
    split = triton.cdiv(k, k_per_split)  # no empty shares
    target = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32,
                                                device=xq.device)
    e8m0 = scale.dtype != torch.float32
    s = scale.view(torch.uint8) if e8m0 else scale
    grid = (triton.cdiv(m, tile.block_m) * triton.cdiv(n, tile.block_n), split)
    _w8a8_kernel[grid](xq, x_scale, w, s, target, m, n, k, xq.stride(0), x_scale.stride(0),
                       x_scale.stride(1), w.stride(0), s.stride(0), k_per_split,
                       BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=GROUP,
                       GROUP_M=tile.group_m, E8M0=e8m0, **dot_options(xq),
                       num_warps=tile.num_warps, num_stages=tile.num_stages,
                       **pdl_launch(xq))
    if split > 1:
        sum_slices(target, out, split, m * n, n)
    return out
