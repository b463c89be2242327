# mypy: disable-error-code="no-untyped-def"
"""The K steps of the FP8 block-scaled products (`triton.py`'s kernel): block scales decoded
(E8M0 bytes or float32 multipliers); one activation row against BLOCK_N weight rows on the
CUDA cores, a step at a time (`_rows1`, and the pieces a step preloaded before the PDL wait
is folded with); more rows as `tl.dot` tiles with the weight as the left operand (`_tiles`).
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import triton
import triton.language as tl

from openinfer_kernels.dot import dot


@triton.jit
def e8m0_to_fp32(byte, EXTRA: tl.constexpr):
    """E8M0 bytes -> fp32 2^(byte - 127 + EXTRA), built from exponent bits (exact, no exp2):
    byte 255 is NaN, a result past fp32's range inf, 2^-127 the one subnormal (byte 0)."""
    e = byte.to(tl.int32)
    field = e + EXTRA
    bits = tl.where(field >= 255, 0x7F800000, tl.where(field <= 0, 0x00400000, field << 23))
    bits = tl.where(e == 255, 0x7FC00000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _block_scales(ptrs, mask, E8M0: tl.constexpr):
    """fp32 block scales at `ptrs`, 1 where masked: E8M0 bytes decoded, or float32 read."""
    if E8M0:
        s = e8m0_to_fp32(tl.load(ptrs, mask=mask, other=127), 0)
    else:
        s = tl.load(ptrs, mask=mask, other=1.0).to(tl.float32)
    return s


@triton.jit
def _step_weights(w_rows, n_ok, k, k_end, BLOCK_K: tl.constexpr):
    """A K step of the weight rows at `w_rows` ([BLOCK_N, 1] pointers) from k: [BLOCK_N,
    BLOCK_K] e4m3, none at or past k_end, none of the rows not `n_ok`."""
    rk = k + tl.arange(0, BLOCK_K)
    return tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & (rk < k_end)[None, :], other=0.0)


@triton.jit
def _step_part(w, x_ptr, k, k_end, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               SUB: tl.constexpr):
    """The activation row's BLOCK_K values from k times the step's tile `w`, each SUB-wide
    piece summed: fp32 [BLOCK_N, BLOCK_K // SUB]."""
    rk = k + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + rk, mask=rk < k_end, other=0.0)
    prod = w.to(tl.float32) * x.to(tl.float32)[None, :]
    return tl.sum(tl.reshape(prod, [BLOCK_N, BLOCK_K // SUB, SUB]), axis=2)


@triton.jit
def _step_scales(s_rows, n_ok, k, k_end, BLOCK_K: tl.constexpr, SUB: tl.constexpr,
                 E8M0: tl.constexpr):
    """The fp32 scales of a K step's SUB-wide pieces ([BLOCK_N, BLOCK_K // SUB]) of the rows
    whose scale rows are at `s_rows` ([BLOCK_N, 1] pointers)."""
    kb = k // 128 + tl.arange(0, BLOCK_K // SUB)
    return _block_scales(s_rows + kb[None, :], n_ok[:, None] & (kb * 128 < k_end)[None, :],
                         E8M0)


@triton.jit
def _step_tiles(w_rows, s_rows, u_rows, t_rows, n_ok, k, k_end, BLOCK_K: tl.constexpr,
                SUB: tl.constexpr, E8M0: tl.constexpr, GATED: tl.constexpr):
    """A K step's weight tile and scales from k, and (GATED) the up rows' (at `u_rows`,
    `t_rows`); without GATED the last two are the first two again, unused."""
    w = _step_weights(w_rows, n_ok, k, k_end, BLOCK_K)
    s = _step_scales(s_rows, n_ok, k, k_end, BLOCK_K, SUB, E8M0)
    u = w
    t = s
    if GATED:
        u = _step_weights(u_rows, n_ok, k, k_end, BLOCK_K)
        t = _step_scales(t_rows, n_ok, k, k_end, BLOCK_K, SUB, E8M0)
    return w, s, u, t


@triton.jit
def _fold_step(acc, w, s, x_row, k, k_end, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               SUB: tl.constexpr):
    """`acc` plus the activation row times a step's tile `w` loaded already, scaled by `s`:
    one step of `_rows1`."""
    return acc + tl.sum(_step_part(w, x_row, k, k_end, BLOCK_N, BLOCK_K, SUB) * s, axis=1)


@triton.jit
def _rows1(acc, x_ptr, w_rows, s_rows, n_ok, k_start, k_end, BLOCK_N: tl.constexpr,
           BLOCK_K: tl.constexpr, SUB: tl.constexpr, E8M0: tl.constexpr):
    """[BLOCK_N] fp32: `acc` plus one activation row times the weight rows at `w_rows` (their
    scale rows at `s_rows`) over K in [k_start, k_end), a step at a time in order; each
    SUB-wide piece of a step (SUB = min(BLOCK_K, 128)) summed, then scaled. A step loads the
    weights, the inputs, then the scales."""
    for k in range(k_start, k_end, BLOCK_K):
        w = _step_weights(w_rows, n_ok, k, k_end, BLOCK_K)
        part = _step_part(w, x_ptr, k, k_end, BLOCK_N, BLOCK_K, SUB)
        s = _step_scales(s_rows, n_ok, k, k_end, BLOCK_K, SUB, E8M0)
        acc += tl.sum(part * s, axis=1)
    return acc


@triton.jit
def _tiles(x_ptr, w_ptr, s_ptr, rn, n_ok, rm, m_ok, k_start, k_end, stride_xm, stride_wn,
           stride_sn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
           PRECISION: tl.constexpr, UPCAST: tl.constexpr, E8M0: tl.constexpr):
    """[BLOCK_N, BLOCK_M] fp32, transposed: weight rows `rn` times activation rows `rm`."""
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    w_rows = w_ptr + rn[:, None].to(tl.int64) * stride_wn
    s_rows = s_ptr + (rn // 128) * stride_sn
    x_rows = x_ptr + rm[:, None].to(tl.int64) * stride_xm
    for k in range(k_start, k_end, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        k_ok = rk < k_end
        w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_rows + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        s = _block_scales(s_rows + k // 128, n_ok, E8M0)
        if E8M0:  # a power of two: the scaled weight tile is exact in x's dtype
            w = (w.to(tl.float32) * s[:, None]).to(x.dtype)
            acc += dot(w, tl.trans(x), PRECISION, UPCAST)
        else:  # the step lies in one scale block: its fp32 product takes the scale, unrounded
            acc += dot(w.to(x.dtype), tl.trans(x), PRECISION, UPCAST) * s[:, None]
    return acc
