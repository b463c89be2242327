# mypy: disable-error-code="no-untyped-def"
"""The FP4 experts for a few tokens (decode): matrix-vector products on the CUDA cores, one
program per (token, expert) pair and block of weight rows, with no routing step before them.

Two launches: the first streams gate and up rows of a pair's expert against its token and
writes h = silu(min(gate, limit)) * clamp(up, ±limit) [T * k, I] in x's dtype (as the grouped
path does); the second, one program per token and block of output columns, streams the down
rows of each of the token's k experts in slot order, scales each by its routing weight and
writes their sum: the combine over the top-k is that loop, so no fp32 [T * k, H] buffer and no
sum launch. At one token the second launch has only H / BLOCK_N programs, so it may also split
the inputs (split-K) and the slots (each share a run of the token's slots): each share then
lands in an fp32 workspace, and the last share of a (token, column block) to arrive adds them
in share order (`openinfer_kernels.split_k`'s arrival counts; where there are none, inside a
capture before any, or with OPENINFER_SPLIT_SUM=kernel, `sum_slices` does it, a third launch).
The same bits every run.

A K step dequantizes [BLOCK_N, BLOCK_K / 2] bytes: each e2m1 code's bits are placed in an fp16
(the value times 2^-14, exact) and multiplied by the token's input, the even inputs by the low
nibbles and the odd by the high ones (the input row is split in registers, the codes are
never interleaved); each 32-input group is summed, then scaled once by its E8M0 scale (times
2^14). A pair whose routing weight is 0 reads nothing: its contribution is exactly 0 (the
reference's 0 * product, except where that product is inf or NaN, as a padded row's may be).

`settled`: the caller's x, ids and weights were written two or more kernels before these (the
MoE sublayer runs the shared expert between its router and its routed experts). With
`OPENINFER_PDL_PRELOAD=experts` the first launch then reads and computes everything before its
PDL wait (`openinfer_kernels.pdl`) and only stores after it, so its work overlaps the kernel
before it. Off until measured.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from openinfer_kernels import split_k
from openinfer_kernels.fp8_linear.steps import e8m0_to_fp32
from openinfer_kernels.fp8_linear.triton import sum_slices
from openinfer_kernels.pdl import pdl_enter, pdl_launch, preloads
from openinfer_kernels.side_stream import wait_for

PRELOAD = preloads("experts")  # OPENINFER_PDL_PRELOAD names it; read once


@dataclass(frozen=True, slots=True)
class DecodeTile:
    """block_n / block_k: gate_up rows (each of gate and up) and inputs per program step;
    down_block_n / down_block_k: the same for down; down_split: K shares of down (1: none);
    down_slot_split: shares of each token's slots in down, each K share split so (1: none).
    Block sizes are powers of two, block_k's at least 32 (one scale group)."""

    block_n: int = 16
    block_k: int = 512
    down_block_n: int = 16
    down_block_k: int = 512
    down_split: int = 1
    num_warps: int = 4
    num_stages: int = 3
    down_slot_split: int = 1


# (most tokens, tile): the first row whose bound holds, else the last. Picked by
# benchmarks/device/dsv4_moe_sweep.py on the H100 at V4-Flash's shapes: at one token
# narrow rows with long K steps and down split in two (74.9 us = 2.3x the read floor; grouped
# 5.1x), from 4 to 16 tokens 32 rows by 512 inputs (1.8-1.9x).
DECODE_TILES: tuple[tuple[int, DecodeTile], ...] = (
    (1, DecodeTile(block_n=8, block_k=1024, down_block_n=8, down_block_k=1024, down_split=2)),
    (16, DecodeTile(block_n=32, down_block_n=32)),
)


# The same for the narrower experts a tensor-parallel rank holds (its share of I: 1024 at TP2,
# 512 at TP4), keyed by that width; a width not here takes DECODE_TILES. Swept with
# `dsv4_moe_sweep.py --tp N` (gpu_check.sh stage dsv4moe): at 512 on the H100, four tokens
# 68.6 us against DECODE_TILES' 75.8 (down's K step no longer than its 512 inputs), 16 the
# same; on one H200, one token 24.9 us with 4-row gate_up programs and down's 6 slots in 3
# shares against 33.5 for the 8-row tile without shares (7.3 us the read floor); at 1024
# DECODE_TILES was already the best (H100).
WIDTH_TILES: dict[int, tuple[tuple[int, DecodeTile], ...]] = {
    512: ((1, DecodeTile(block_n=4, block_k=1024, down_block_n=16, down_block_k=512,
                         down_slot_split=3)),
          (4, DecodeTile(block_n=16, block_k=512, down_block_n=32, down_block_k=512)),
          (16, DecodeTile(block_n=32, down_block_n=32))),
}


def decode_tile(tokens: int, inter: int | None = None) -> DecodeTile:
    """The tile for `tokens` tokens of experts `inter` wide (None: V4-Flash's own width)."""
    table = WIDTH_TILES.get(inter, DECODE_TILES) if inter is not None else DECODE_TILES
    return next((tile for most, tile in table if tokens <= most), table[-1][1])


@triton.jit
def _e2m1_fp32(code):
    """Low 4 bits of int32 `code` (e2m1: sign, 2 exponent bits, 1 mantissa bit) -> fp32 value
    times 2^-14: the bits placed in an fp16's sign, exponent and mantissa (0.5 a subnormal,
    which the conversion to fp32 keeps exact)."""
    bits = ((code & 0x7) << 9) | ((code & 0x8) << 12)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _inputs(x_row, k, k_end, BLOCK_K: tl.constexpr):
    """The even and odd inputs of [k, k + BLOCK_K) (k a multiple of BLOCK_K; 0 from k_end on),
    fp32, [BLOCK_K / 2] each: one contiguous load, split in registers."""
    ri = tl.max_contiguous(tl.multiple_of(k + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
    x = tl.load(x_row + ri, mask=ri < k_end, other=0.0).to(tl.float32)
    return tl.split(tl.reshape(x, [BLOCK_K // 2, 2]))


@triton.jit
def _fp4_step(w_rows, s_rows, n_ok, even, odd, k, k_end, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """[BLOCK_N] fp32: weight rows (byte pointers `w_rows`, scale pointers `s_rows`, both
    [BLOCK_N, 1]; rows not `n_ok` are not read) times the inputs [k, k + BLOCK_K) (k a
    multiple of BLOCK_K), cut at k_end (a multiple of 32). EVEN_K: no step is cut, so the
    byte loads go unmasked along K, as wide as the hardware's (a mask on K would narrow them
    to what the compiler can prove of k_end's divisibility)."""
    rb = tl.max_contiguous(tl.multiple_of(k // 2 + tl.arange(0, BLOCK_K // 2), BLOCK_K // 2),
                           BLOCK_K // 2)
    rg = k // 32 + tl.arange(0, BLOCK_K // 32)
    if EVEN_K:
        b_ok = n_ok[:, None]
        s_ok = n_ok[:, None]
    else:
        b_ok = n_ok[:, None] & (rb < k_end // 2)[None, :]
        s_ok = n_ok[:, None] & (rg < k_end // 32)[None, :]
    b = tl.load(w_rows + rb[None, :], mask=b_ok, other=0).to(tl.int32)
    prod = _e2m1_fp32(b) * even[None, :] + _e2m1_fp32(b >> 4) * odd[None, :]
    group = tl.sum(tl.reshape(prod, [BLOCK_N, BLOCK_K // 32, 16]), axis=2)
    s = tl.load(s_rows + rg[None, :], mask=s_ok, other=0)
    return tl.sum(group * e8m0_to_fp32(s, 14), axis=1)


@triton.jit
def _gate_up_kernel(x_ptr, ids_ptr, rw_ptr, w_ptr, s_ptr, h_ptr, N, K, top_k, stride_xm,
                    stride_ids, stride_rw, stride_we, stride_wn, stride_se, stride_sn,
                    stride_hm, limit, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    EVEN_K: tl.constexpr, PDL: tl.constexpr, SETTLED: tl.constexpr = False):
    """h[pair, block] for pair = token * top_k + slot: gate rows [0, N) and up rows [N, 2N)
    of the pair's expert (K inputs) against its token's row of x, SwiGLU-clamped. SETTLED:
    x, ids and the routing weights were written two or more kernels back, so everything but
    the store runs before `pdl_enter`."""
    if not SETTLED:
        pdl_enter(PDL)
    pair = tl.program_id(0)
    token = pair // top_k
    slot = pair % top_k
    route_w = tl.load(rw_ptr + token * stride_rw + slot)
    if route_w != 0:
        expert = tl.load(ids_ptr + token * stride_ids + slot).to(tl.int64)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < N
        w_gate = w_ptr + expert * stride_we + rn[:, None].to(tl.int64) * stride_wn
        s_gate = s_ptr + expert * stride_se + rn[:, None].to(tl.int64) * stride_sn
        w_up = w_gate + N * stride_wn
        s_up = s_gate + N * stride_sn
        x_row = x_ptr + token.to(tl.int64) * stride_xm
        gate = tl.zeros([BLOCK_N], dtype=tl.float32)
        up = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            even, odd = _inputs(x_row, k, K, BLOCK_K)
            gate += _fp4_step(w_gate, s_gate, n_ok, even, odd, k, K, BLOCK_N, BLOCK_K, EVEN_K)
            up += _fp4_step(w_up, s_up, n_ok, even, odd, k, K, BLOCK_N, BLOCK_K, EVEN_K)
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        h = gate / (1.0 + tl.exp(-gate)) * up
        if SETTLED:  # only the store waits (h's memory may be what the kernel before reads)
            pdl_enter(PDL)
        tl.store(h_ptr + pair.to(tl.int64) * stride_hm + rn, h.to(h_ptr.dtype.element_ty),
                 mask=n_ok)


@triton.jit
def _down_kernel(h_ptr, ids_ptr, rw_ptr, w_ptr, s_ptr, add_ptr, out_ptr, final_ptr, count_ptr,
                 N, K, top_k, steps_per_split, slots_per_share, k_shares, stride_hm,
                 stride_ids, stride_rw, stride_we, stride_wn, stride_se, stride_sn, stride_am,
                 stride_os, stride_om, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN_K: tl.constexpr, ADD: tl.constexpr, PDL: tl.constexpr,
                 SERIAL: tl.constexpr = False):
    """out[split, token, block], split = slot share * k_shares + K share: over the share's
    slots (slots_per_share of them from its first) in order, the routing weight times the
    slot's expert's down rows against its row of h, inputs of this K share only; ADD: the
    first share starts from the token's row of `add` instead of 0. One loop over (slot,
    step), so loads run ahead across slots (unrolling the slots at compile time measured
    slower at every tile and token count: dsv4_moe_sweep.py, H200); a slot of weight 0 masks
    its loads. SERIAL (out the fp32 shares): the block's last share to arrive at its count
    (count_ptr + token * blocks + block) adds the shares in order into final_ptr [T, N]."""
    pdl_enter(PDL)
    token = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    n_ok = rn < N
    k_start = (split % k_shares) * steps_per_split * BLOCK_K
    k_end = tl.minimum(k_start + steps_per_split * BLOCK_K, K)
    steps = tl.cdiv(k_end - k_start, BLOCK_K)
    first_slot = (split // k_shares) * slots_per_share
    slots = tl.minimum(slots_per_share, top_k - first_slot)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    if ADD:  # noqa: SIM102 (a compile-time branch around a runtime one)
        if split == 0:
            acc += tl.load(add_ptr + token.to(tl.int64) * stride_am + rn, mask=n_ok,
                           other=0.0).to(tl.float32)
    for i in range(slots * steps):
        nth = i // steps  # the share's nth slot
        acc = _down_slot_step(acc, h_ptr, ids_ptr, rw_ptr, w_ptr, s_ptr, token,
                              first_slot + nth, k_start + (i - nth * steps) * BLOCK_K, k_end,
                              rn, N, top_k,
                              stride_hm, stride_ids, stride_rw, stride_we, stride_wn,
                              stride_se, stride_sn, BLOCK_N, BLOCK_K, EVEN_K)
    out = out_ptr + split.to(tl.int64) * stride_os + token.to(tl.int64) * stride_om + rn
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_ok)
    if SERIAL:
        split_k.sum_if_last(out_ptr, final_ptr,
                            count_ptr + token * tl.num_programs(1) + tl.program_id(1),
                            token + tl.arange(0, 1), rn, n_ok[None, :], tl.num_programs(0), N,
                            N, N, tl.num_programs(2), False, 1, BLOCK_N)


@triton.jit
def _down_slot_step(acc, h_ptr, ids_ptr, rw_ptr, w_ptr, s_ptr, token, slot, k, k_end, rn, N,
                    top_k, stride_hm, stride_ids, stride_rw, stride_we, stride_wn, stride_se,
                    stride_sn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    EVEN_K: tl.constexpr):
    """acc + the slot's routing weight times its expert's down rows `rn` against its row of
    h over the inputs [k, k + BLOCK_K) (cut at k_end)."""
    route_w = tl.load(rw_ptr + token * stride_rw + slot).to(tl.float32)
    expert = tl.load(ids_ptr + token * stride_ids + slot).to(tl.int64)
    w_rows = w_ptr + expert * stride_we + rn[:, None].to(tl.int64) * stride_wn
    s_rows = s_ptr + expert * stride_se + rn[:, None].to(tl.int64) * stride_sn
    h_row = h_ptr + (token * top_k + slot).to(tl.int64) * stride_hm
    use = route_w != 0  # else h's row was never written: read neither it nor the expert
    even, odd = _inputs(h_row, k, tl.where(use, k_end, 0), BLOCK_K)
    part = _fp4_step(w_rows, s_rows, rn < tl.where(use, N, 0), even, odd, k, k_end,
                     BLOCK_N, BLOCK_K, EVEN_K)
    return acc + part * route_w


def fp4_moe_decode(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                   gate_up: torch.Tensor, gate_up_scale: torch.Tensor, down: torch.Tensor,
                   down_scale: torch.Tensor, limit: float, tile: DecodeTile | None = None,
                   add: torch.Tensor | None = None, settled: bool = False,
                   add_ready: torch.cuda.Event | None = None) -> torch.Tensor:
    """`fp4_moe_experts` (shapes as there, checked by the caller; weights and scales as
    uint8 views) by the decode kernels -> [T, H] in x's dtype; `tile` overrides
    `decode_tile` (benchmarks). `add` [T, H] (rows contiguous): added in fp32 to the
    experts' sum before its one rounding (the shared expert's output: no add launch);
    `add_ready`: the event of the side stream that writes `add` (`side_stream.beside`),
    waited for by the down launch only. `settled`: x, ids and weights were written two or
    more kernels back (see the module). No host sync (CUDA-graph capturable)."""
    (t, hidden), top_k = x.shape, ids.shape[1]
    inter = gate_up.shape[1] // 2
    tile = tile or decode_tile(t, inter)
    ids = ids if ids.stride(1) == 1 else ids.contiguous()
    weights = weights if weights.stride(1) == 1 else weights.contiguous()
    pdl = pdl_launch(x)
    common = dict(num_warps=tile.num_warps, num_stages=tile.num_stages, **pdl)
    h = torch.empty((t * top_k, inter), dtype=x.dtype, device=x.device)
    _gate_up_kernel[(t * top_k, triton.cdiv(inter, tile.block_n))](
        x, ids, weights, gate_up, gate_up_scale, h, inter, hidden, top_k, x.stride(0),
        ids.stride(0), weights.stride(0), gate_up.stride(0), gate_up.stride(1),
        gate_up_scale.stride(0), gate_up_scale.stride(1), h.stride(0), float(limit),
        BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, EVEN_K=hidden % tile.block_k == 0,
        SETTLED=settled and PRELOAD and pdl["PDL"], **common)
    # Shares in whole steps and whole slots, none empty.
    steps_per_split = triton.cdiv(triton.cdiv(inter, tile.down_split), tile.down_block_k)
    k_shares = triton.cdiv(inter, steps_per_split * tile.down_block_k)
    slots_per_share = triton.cdiv(top_k, tile.down_slot_split)
    split = k_shares * triton.cdiv(top_k, slots_per_share)
    out = torch.empty((t, hidden), dtype=x.dtype, device=x.device)
    target = out if split == 1 else torch.empty((split, t, hidden), dtype=torch.float32,
                                                device=x.device)
    blocks = triton.cdiv(hidden, tile.down_block_n)
    # OPENINFER_SPLIT_SUM=kernel: the sum launch, as the split linears take it (an A/B)
    serial = split > 1 and split_k.SERIAL_SUM
    counts = split_k.counts_for(x.device, t * blocks) if serial else None
    wait_for(add_ready)
    _down_kernel[(t, blocks, split)](
        h, ids, weights, down, down_scale, add if add is not None else out, target, out,
        counts if counts is not None else out, hidden, inter, top_k, steps_per_split,
        slots_per_share, k_shares, h.stride(0), ids.stride(0), weights.stride(0),
        down.stride(0), down.stride(1), down_scale.stride(0), down_scale.stride(1),
        add.stride(0) if add is not None else 0, t * hidden, hidden,
        BLOCK_N=tile.down_block_n, BLOCK_K=tile.down_block_k,
        EVEN_K=inter % tile.down_block_k == 0, ADD=add is not None,
        SERIAL=counts is not None, **common)
    if split > 1 and counts is None:
        sum_slices(target, out, split, t * hidden, hidden)
    return out
