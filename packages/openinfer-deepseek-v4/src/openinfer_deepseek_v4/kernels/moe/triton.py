# mypy: disable-error-code="no-untyped-def"
"""Routed experts with FP4 weights and bf16 (or fp32) activations, weight-only quantized: the
e2m1 codes and their E8M0 scales are dequantized in registers, so the result is
`moe_experts_ref` of the dequantized experts up to summation order and roundings.

Three launches after the routing (`align.py`): a grouped GEMM over the expert tiles for
gate_up with the clamped SwiGLU in its epilogue, writing h [P, I] in expert order; a grouped
GEMM for down that scales each row by its routing weight and writes it, in fp32, to its pair's
row of y [T * k, H]; and a fixed-order sum of each token's k rows. No atomics: the same bits
every run. A tile streams only its own expert's weights, so a decode step reads the picked
experts and nothing else. Weight rows fill the MMA's wide side (BLOCK_N), the tile's few
tokens its narrow side (BLOCK_M).

A few tokens (`DECODE_MAX_PAIRS` pairs at most) take the decode path instead (`decode.py`):
matrix-vector products per pair, no routing step, two or three launches. OPENINFER_MOE=decode
or =grouped forces one path at every size.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch
import triton
import triton.language as tl

from openinfer_deepseek_v4.kernels.moe.align import align_by_expert
from openinfer_deepseek_v4.kernels.moe.decode import DecodeTile, fp4_moe_decode
from openinfer_kernels.dot import dot, dot_options
from openinfer_kernels.fp8_linear.steps import e8m0_to_fp32
from openinfer_kernels.fp8_linear.triton import sum_slices
from openinfer_kernels.pdl import pdl_enter, pdl_launch
from openinfer_kernels.side_stream import wait_for

GROUP = 32  # inputs per FP4 scale
# (token, expert) pairs up to which the decode path runs: there each pair streams its expert's
# weights on its own, so past a few pairs an expert that two tokens picked is read twice. On
# the H100 (benchmarks/device/dsv4_moe_sweep.py) decode is faster at 6, 24 and 96 pairs (16
# tokens at top-6: 842 vs 1115 us) and grouped at 384 (2561 vs 3079 us).
DECODE_MAX_PAIRS = 96
_CHOICE = os.environ.get("OPENINFER_MOE") or None
if _CHOICE not in (None, "decode", "grouped"):
    raise ValueError(f"OPENINFER_MOE must be 'decode' or 'grouped' (or unset: decode up to "
                     f"{DECODE_MAX_PAIRS} (token, expert) pairs), not {_CHOICE!r}")


@triton.jit
def _fp4_tile(w_ptr, s_ptr, rn, n_ok, k, K, stride_wn, stride_sn, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, DTYPE: tl.constexpr):
    """[BLOCK_N, BLOCK_K] of weight rows `rn`, inputs [k, k + BLOCK_K), dequantized to DTYPE
    (0 past K). Each code's bits are placed in an fp16 (exponent and mantissa bits as they
    are, so the fp16 is the e2m1 value times 2^-14, 0.5 a subnormal) and the scale's
    multiplier carries the 2^14 back."""
    rb = k // 2 + tl.arange(0, BLOCK_K // 2)
    b = tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_wn + rb[None, :],
                mask=n_ok[:, None] & (rb < K // 2)[None, :], other=0).to(tl.int32)
    lo = ((b & 0x07) << 9) | ((b & 0x08) << 12)  # the even input: low nibble
    hi = ((b & 0x70) << 5) | ((b & 0x80) << 8)
    v = tl.join(lo, hi).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    v = tl.reshape(v, [BLOCK_N, BLOCK_K // 32, 32])
    rg = k // 32 + tl.arange(0, BLOCK_K // 32)
    s = tl.load(s_ptr + rn[:, None] * stride_sn + rg[None, :],
                mask=n_ok[:, None] & (rg < K // 32)[None, :], other=0)
    v = v * e8m0_to_fp32(s, 14)[:, :, None]
    return tl.reshape(v, [BLOCK_N, BLOCK_K]).to(DTYPE)


@triton.jit
def _tile_product(a_ptr, w_ptr, s_ptr, a_row, row_ok, rn, n_ok, N, K, stride_am, stride_wn,
                  stride_sn, GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """([BLOCK_N, BLOCK_M] fp32, transposed) weight rows `rn` times activation rows `a_row`;
    GATED: also the rows N below them (the up projection), else the second is zeros."""
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    a_rows = a_ptr + a_row[:, None].to(tl.int64) * stride_am
    for k in range(0, K, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        a = tl.load(a_rows + rk[None, :], mask=row_ok[:, None] & (rk < K)[None, :], other=0.0)
        a_t = tl.trans(a)
        w = _fp4_tile(w_ptr, s_ptr, rn, n_ok, k, K, stride_wn, stride_sn, BLOCK_N, BLOCK_K,
                      a.dtype)
        acc += dot(w, a_t, PRECISION, UPCAST)
        if GATED:
            w_up = _fp4_tile(w_ptr + N * stride_wn, s_ptr + N * stride_sn, rn, n_ok, k, K,
                             stride_wn, stride_sn, BLOCK_N, BLOCK_K, a.dtype)
            acc_up += dot(w_up, a_t, PRECISION, UPCAST)
    return acc, acc_up


@triton.jit
def _expert_kernel(a_ptr, w_ptr, s_ptr, out_ptr, pair_ptr, tile_expert_ptr, tile_start_ptr,
                   tile_rows_ptr, route_w_ptr, N, K, top_k, num_experts, stride_am, stride_we,
                   stride_wn, stride_se, stride_sn, stride_om, limit, GATED: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   PRECISION: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    """Output columns [pid_n * BLOCK_N, +BLOCK_N) of one expert tile. GATED (gate_up, N = I):
    rows are the tokens of the tile's pairs; writes silu(min(gate, limit)) * clamp(up, ±limit)
    to the tile's rows of h. Else (down, N = H): rows are h's; writes the routing weight times
    the product to the pairs' rows of y (fp32). A tile of the bucket after the experts
    (`num_experts`: pairs of another rank's experts) computes nothing and, in the down
    product, writes its pairs' rows of y as zeros."""
    pdl_enter(PDL)
    tile = tl.program_id(0)
    expert = tl.load(tile_expert_ptr + tile)
    if expert >= 0:  # tiles past the last real one do nothing
        start = tl.load(tile_start_ptr + tile)
        r = tl.arange(0, BLOCK_M)
        row_ok = r < tl.load(tile_rows_ptr + tile)
        pair = tl.load(pair_ptr + start + r, mask=row_ok, other=0)
        a_row = pair // top_k if GATED else start + r
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < N
        mask = n_ok[:, None] & row_ok[None, :]
        if expert == num_experts:
            if not GATED:
                out = out_ptr + pair[None, :].to(tl.int64) * stride_om + rn[:, None]
                tl.store(out, tl.zeros([BLOCK_N, BLOCK_M], tl.float32), mask=mask)
        else:
            acc, up = _tile_product(a_ptr, w_ptr + expert.to(tl.int64) * stride_we,
                                    s_ptr + expert.to(tl.int64) * stride_se, a_row, row_ok,
                                    rn, n_ok, N, K, stride_am, stride_wn, stride_sn, GATED,
                                    BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, UPCAST)
            if GATED:
                gate = tl.minimum(acc, limit)
                up = tl.minimum(tl.maximum(up, -limit), limit)
                h = gate / (1.0 + tl.exp(-gate)) * up
                out = out_ptr + (start + r)[None, :].to(tl.int64) * stride_om + rn[:, None]
                tl.store(out, h.to(out_ptr.dtype.element_ty), mask=mask)
            else:
                route_w = tl.load(route_w_ptr + pair, mask=row_ok, other=0.0)
                out = out_ptr + pair[None, :].to(tl.int64) * stride_om + rn[:, None]
                tl.store(out, acc * route_w[None, :], mask=mask)

def moe_block_m(pairs: int, num_experts: int) -> int:
    """Rows per expert tile, from the mean rows an expert gets: 16 (the MMA's narrowest side)
    for decode, up to 128 for long prompts. 128 where an expert gets more: each FP4 weight
    tile is then decoded once for twice the rows (benchmarks/device/dsv4_moe_prefill.py on one
    H200, 8,192 tokens, 192 rows an expert: 14.4 against 17.9 ms at V4-Flash's width, 7.7
    against 9.7 at a TP2 rank's)."""
    per_expert = pairs / max(1, min(pairs, num_experts))
    return (16 if per_expert <= 16 else 32 if per_expert <= 32 else 64 if per_expert <= 128
            else 128)


@dataclass(frozen=True, slots=True)
class GroupedTile:
    """The grouped GEMMs' launch: token rows (block_m) and weight rows (block_n) a tile, and
    its warps and pipeline stages."""

    block_m: int
    block_n: int = 64
    warps: int = 4
    stages: int = 3


def grouped_tile(pairs: int, num_experts: int, fp32: bool) -> GroupedTile:
    """The grouped GEMMs' tile for `pairs` (token, expert) pairs over `num_experts` experts:
    `moe_block_m`'s rows, 64 weight rows, 4 warps (in fp32 2 stages, whose K step is half,
    and at most 64 rows: the 128-row tile was measured in bf16 only)."""
    if fp32:
        return GroupedTile(min(64, moe_block_m(pairs, num_experts)), stages=2)
    return GroupedTile(moe_block_m(pairs, num_experts))


def _check(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
           gate_up_scale: torch.Tensor, down: torch.Tensor, down_scale: torch.Tensor) -> None:
    (t, h), (e, two_i) = x.shape, gate_up.shape[:2]
    inter = two_i // 2
    shapes = {"ids": (tuple(ids.shape), (t, ids.shape[-1])),
              "weights": (tuple(weights.shape), tuple(ids.shape)),
              "gate_up": (tuple(gate_up.shape), (e, 2 * inter, h // 2)),
              "gate_up_scale": (tuple(gate_up_scale.shape), (e, 2 * inter, h // GROUP)),
              "down": (tuple(down.shape), (e, h, inter // 2)),
              "down_scale": (tuple(down_scale.shape), (e, h, inter // GROUP))}
    for name, (got, want) in shapes.items():
        if got != want:
            raise ValueError(f"fp4_moe_experts: {name} must be {want} for x {tuple(x.shape)} "
                             f"and gate_up {tuple(gate_up.shape)}, got {got}")
    if h % GROUP or inter % GROUP or x.stride(1) != 1:
        raise ValueError(f"fp4_moe_experts: H ({h}) and I ({inter}) must be multiples of "
                         f"{GROUP} and x K-contiguous")
    if any(not t.is_contiguous() or t.element_size() != 1
           for t in (gate_up, gate_up_scale, down, down_scale)):
        raise ValueError("fp4_moe_experts: packed weights and scales must be contiguous bytes")


def fp4_moe_experts_triton(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                           gate_up: torch.Tensor, gate_up_scale: torch.Tensor,
                           down: torch.Tensor, down_scale: torch.Tensor, limit: float, *,
                           path: Literal["auto", "decode", "grouped"] = "auto",
                           tile: DecodeTile | None = None,
                           add: torch.Tensor | None = None,
                           settled: bool = False,
                           grouped: GroupedTile | None = None,
                           add_ready: torch.cuda.Event | None = None) -> torch.Tensor:
    """x [T, H] bf16/fp32, ids [T, k] int, weights [T, k] fp32, gate_up [E, 2I, H/2] and
    down [E, H, I/2] packed e2m1 (uint8/int8), scales [E, 2I, H/32], [E, H, I/32] E8M0
    (uint8/float8_e8m0fnu) -> [T, H] in x's dtype; `add` [T, H] in x's dtype, added to it
    (on the decode path in the down kernel, before the result's rounding), once the current
    stream has waited for `add_ready` where given (the side stream's event that marks `add`
    written: `side_stream.beside`); `settled`: x, ids and weights were written two or more
    kernels back (the decode path may then compute before its PDL wait: `decode.py`). No host
    sync (CUDA-graph capturable).
    `path`, `tile` (the decode path's) and `grouped` (the grouped path's) override
    `takes_decode_path`, `decode_tile` and `grouped_tile` (benchmarks, tests)."""
    _check(x, ids, weights, gate_up, gate_up_scale, down, down_scale)
    (t, hidden), top_k = x.shape, ids.shape[1]
    if add is not None and (add.shape != x.shape or add.dtype != x.dtype):
        raise ValueError(f"fp4_moe_experts: add must be {tuple(x.shape)} {x.dtype}, got "
                         f"{tuple(add.shape)} {add.dtype}")
    if t * top_k == 0:
        out = torch.zeros((t, hidden), dtype=x.dtype, device=x.device)
        wait_for(add_ready)
        return out if add is None else out + add
    packed = (gate_up.view(torch.uint8), gate_up_scale.view(torch.uint8), down.view(torch.uint8),
              down_scale.view(torch.uint8))
    if path == "decode" or (path == "auto" and takes_decode_path(t * top_k)):
        if add is not None and add.stride(1) != 1:
            add = add.contiguous()
        return fp4_moe_decode(x, ids, weights, *packed, limit, tile, add, settled, add_ready)
    out = _grouped(x, ids, weights, *packed, limit, grouped)
    wait_for(add_ready)
    return out if add is None else out + add


def takes_decode_path(pairs: int) -> bool:
    """Whether a call of `pairs` (token, expert) pairs runs the decode path: as
    OPENINFER_MOE says where set, else up to `DECODE_MAX_PAIRS`. A function of the shape
    only, so a CUDA graph captured at a batch size replays the path it was captured with."""
    if _CHOICE is not None:
        return _CHOICE == "decode"
    return pairs <= DECODE_MAX_PAIRS


def _grouped(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
             gate_up_scale: torch.Tensor, down: torch.Tensor, down_scale: torch.Tensor,
             limit: float, tile: GroupedTile | None) -> torch.Tensor:
    (t, hidden), top_k = x.shape, ids.shape[1]
    num_experts, inter = gate_up.shape[0], gate_up.shape[1] // 2
    fp32 = x.dtype == torch.float32
    tile = tile or grouped_tile(t * top_k, num_experts, fp32)
    out = torch.empty((t, hidden), dtype=x.dtype, device=x.device)
    tiles = align_by_expert(ids, num_experts, tile.block_m)
    h = torch.empty((t * top_k, inter), dtype=x.dtype, device=x.device)
    y = torch.empty((t * top_k, hidden), dtype=torch.float32, device=x.device)
    route_w = weights.reshape(-1).to(torch.float32).contiguous()
    block_n, block_k = tile.block_n, 64 if fp32 else 128
    common = dict(BLOCK_M=tiles.block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                  **dot_options(x), num_warps=tile.warps, num_stages=tile.stages,
                  **pdl_launch(x))
    routing = (tiles.pair, tiles.tile_expert, tiles.tile_start, tiles.tile_rows, route_w)
    n_tiles = tiles.tile_expert.numel()
    for a, w, s, target, n, k, gated in ((x, gate_up, gate_up_scale, h, inter, hidden, True),
                                         (h, down, down_scale, y, hidden, inter, False)):
        _expert_kernel[(n_tiles, triton.cdiv(n, block_n))](
            a, w, s, target, *routing, n, k, top_k, num_experts, a.stride(0), w.stride(0),
            w.stride(1), s.stride(0), s.stride(1), target.stride(0), float(limit), GATED=gated,
            **common)
    sum_slices(y, out, top_k, hidden, top_k * hidden)
    return out
