# mypy: disable-error-code="no-untyped-def"
"""`rms_rotary_ref` and `rms_rotary_scatter_ref` in one launch: program = (token, tile of
BLOCK_H heads), each head's row of D values in registers: the RMSNorm in fp32 (rounded to the
output dtype once, after the weight), then the last R dims rotated as pairs with cos and sin
read from the position's table row, rounded again; the leading D - R dims are stored as
normed. The output rows are a new tensor, or with SCATTER the pool rows named by `slots`
(the raw entries of a step into the paged cache; with FP8_NOPE > 0 their leading FP8_NOPE
values rounded to e4m3 in blocks of 64 before they are stored, as `quant_sim`'s
`fp8_round_rows` rounds them in place, so that needs no launch of its own). The launch
depends on shapes only: safe
in CUDA graphs. (The mypy line above: @triton.jit functions annotate only their constexpr
parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_deepseek_v4.kernels.quant_sim.reference import FP8_BLOCK
from openinfer_deepseek_v4.kernels.quant_sim.storage_triton import pow2_ceil, round_to_format
from openinfer_kernels.pdl import pdl_enter, pdl_launch


@triton.jit
def rotate_rows(y, token, pos_ptr, table_ptr, max_positions, ty: tl.constexpr,
                D: tl.constexpr, ROPE: tl.constexpr, BLOCK_H: tl.constexpr,
                BLOCK_D: tl.constexpr, INVERSE: tl.constexpr):
    """y [BLOCK_H, BLOCK_D] fp32 (rows of D values, rounded to `ty`) with the last ROPE dims of
    each row rotated as pairs by token's position (back with INVERSE), cos and sin from the
    position's table row, the rotated pairs rounded to `ty` (`rms_rotary_ref`'s rotation)."""
    # pairs (2i, 2i + 1); pair i rotates by table column i - (D - ROPE) / 2
    pair = tl.arange(0, BLOCK_D // 2)
    col = pair - (D - ROPE) // 2
    rot = (col >= 0) & (pair < D // 2)
    # a position past the table (a padded row's garbage) reads its last row, not memory
    pos = tl.minimum(tl.load(pos_ptr + token), max_positions - 1).to(tl.int64)
    row = table_ptr + pos * ROPE + tl.where(rot, col, 0)
    cos = tl.load(row, mask=rot, other=1.0).to(tl.float32)
    sin = tl.load(row + ROPE // 2, mask=rot, other=0.0).to(tl.float32)
    if INVERSE:
        sin = -sin
    even, odd = tl.split(tl.reshape(y, [BLOCK_H, BLOCK_D // 2, 2]))
    turned = tl.join(even * cos[None, :] - odd * sin[None, :],
                     odd * cos[None, :] + even * sin[None, :])
    turned = tl.reshape(turned, [BLOCK_H, BLOCK_D]).to(ty).to(tl.float32)
    rd = tl.arange(0, BLOCK_D)
    is_rope = (rd >= D - ROPE) & (rd < D)
    return tl.where(is_rope[None, :], turned, y)


@triton.jit
def _rms_rotary_kernel(x_ptr, w_ptr, table_ptr, pos_ptr, slots_ptr, out_ptr, num_heads,
                       max_positions, stride_xt, stride_xh, stride_ot, stride_oh, eps,
                       D: tl.constexpr, ROPE: tl.constexpr, BLOCK_H: tl.constexpr,
                       BLOCK_D: tl.constexpr, NORM: tl.constexpr, WEIGHT: tl.constexpr,
                       INVERSE: tl.constexpr, SCATTER: tl.constexpr, PDL: tl.constexpr,
                       FP8_NOPE: tl.constexpr = 0, FP8_BLOCK: tl.constexpr = 64):
    pdl_enter(PDL)
    _rms_rotary_tile(x_ptr, w_ptr, table_ptr, pos_ptr, slots_ptr, out_ptr,
                     tl.program_id(0).to(tl.int64), tl.program_id(1), num_heads,
                     max_positions, stride_xt, stride_xh, stride_ot, stride_oh, eps, D, ROPE,
                     BLOCK_H, BLOCK_D, NORM, WEIGHT, INVERSE, SCATTER, FP8_NOPE, FP8_BLOCK)


@triton.jit
def _q_kv_kernel(q_ptr, kv_ptr, kv_w_ptr, table_ptr, pos_ptr, slots_ptr, q_out_ptr, pool_ptr,
                 num_heads, max_positions, stride_qt, stride_qh, stride_kvt, stride_pool, eps,
                 D: tl.constexpr, ROPE: tl.constexpr, BLOCK_H: tl.constexpr,
                 BLOCK_D: tl.constexpr, Q_TILES: tl.constexpr, FP8_NOPE: tl.constexpr,
                 FP8_BLOCK: tl.constexpr, PDL: tl.constexpr):
    # Tiles 0..Q_TILES-1 of a token: its query heads, normed (no weight) and rotated into a
    # new tensor; tile Q_TILES: its raw entry, normed with the weight, rotated (and rounded)
    # into its cache row. The code of `_rms_rotary_kernel`'s two launches, in one.
    pdl_enter(PDL)
    token = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    if tile < Q_TILES:
        _rms_rotary_tile(q_ptr, q_ptr, table_ptr, pos_ptr, pos_ptr, q_out_ptr, token, tile,
                         num_heads, max_positions, stride_qt, stride_qh, num_heads * D, D, eps,
                         D, ROPE, BLOCK_H, BLOCK_D, True, False, False, False, 0, FP8_BLOCK)
    else:
        _rms_rotary_tile(kv_ptr, kv_w_ptr, table_ptr, pos_ptr, slots_ptr, pool_ptr, token, 0,
                         1, max_positions, stride_kvt, D, stride_pool, D, eps, D, ROPE, 1,
                         BLOCK_D, True, True, False, True, FP8_NOPE, FP8_BLOCK)


@triton.jit
def _rms_rotary_tile(x_ptr, w_ptr, table_ptr, pos_ptr, slots_ptr, out_ptr, token, tile,
                     num_heads, max_positions, stride_xt, stride_xh, stride_ot, stride_oh, eps,
                     D: tl.constexpr, ROPE: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_D: tl.constexpr, NORM: tl.constexpr, WEIGHT: tl.constexpr,
                     INVERSE: tl.constexpr, SCATTER: tl.constexpr, FP8_NOPE: tl.constexpr,
                     FP8_BLOCK: tl.constexpr):
    """Token `token`'s heads tile*BLOCK_H.. (see the module's docstring)."""
    heads = tile * BLOCK_H + tl.arange(0, BLOCK_H)
    rd = tl.arange(0, BLOCK_D)
    h_ok, d_ok = heads < num_heads, rd < D
    mask = h_ok[:, None] & d_ok[None, :]
    ty = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + token * stride_xt + heads[:, None] * stride_xh + rd[None, :],
                mask=mask, other=0.0)
    y = x.to(tl.float32)
    if NORM:
        y = y * tl.rsqrt(tl.sum(y * y, axis=1) / D + eps)[:, None]
        if WEIGHT:
            y = tl.load(w_ptr + rd, mask=d_ok, other=0.0).to(tl.float32)[None, :] * y
        y = y.to(ty).to(tl.float32)
    else:
        y = x.to(ty).to(tl.float32)
    if ROPE > 0:
        y = rotate_rows(y, token, pos_ptr, table_ptr, max_positions, ty, D, ROPE, BLOCK_H,
                        BLOCK_D, INVERSE)
    if FP8_NOPE > 0:  # as _fp8_rows_kernel rounds the stored (dtype) values
        blocks = tl.reshape(y, [BLOCK_H, BLOCK_D // FP8_BLOCK, FP8_BLOCK])
        amax = tl.maximum(tl.max(tl.abs(blocks), axis=2), 1e-4)
        scale = pow2_ceil(amax * (1.0 / 448.0))[:, :, None]
        rounded = tl.reshape(round_to_format(blocks / scale, 448.0, -6, 3) * scale,
                             [BLOCK_H, BLOCK_D])
        y = tl.where((rd < FP8_NOPE)[None, :], rounded, y)
    dst = token
    if SCATTER:
        dst = tl.load(slots_ptr + token).to(tl.int64)
        mask = mask & (tl.zeros([BLOCK_H, 1], tl.int64) + dst >= 0)  # < 0: skip the token
    tl.store(out_ptr + dst * stride_ot + heads[:, None] * stride_oh + rd[None, :], y.to(ty),
             mask=mask)


def _launch(x: torch.Tensor, weight: torch.Tensor | None, positions: torch.Tensor,
            table: torch.Tensor | None, eps: float | None, inverse: bool, out: torch.Tensor,
            slots: torch.Tensor | None, fp8_nope: int = 0) -> None:
    rows = x if x.dim() == 3 else x.unsqueeze(1)
    dst = out if out.dim() == 3 else out.unsqueeze(1)
    t, h, d = rows.shape
    rope = 0 if table is None else table.shape[1]
    if rows.stride(2) != 1 or dst.stride(2) != 1 or rope > d or rope % 2 or d % 2:
        raise ValueError(f"rms_rotary: need rows contiguous in their last dim, an even D and "
                         f"a table of at most D (even) columns; got x {tuple(x.shape)} "
                         f"strides {x.stride()}, table {None if table is None else table.shape}")
    if weight is not None and weight.shape != (d,):
        raise ValueError(f"rms_rotary: weight must be [{d}], got {tuple(weight.shape)}")
    if t == 0:
        return
    block_d = triton.next_power_of_2(d)
    block_h = max(1, min(triton.next_power_of_2(h), 4096 // block_d))
    _rms_rotary_kernel[(t, triton.cdiv(h, block_h))](
        rows, weight if weight is not None else rows, table if table is not None else rows,
        positions, slots if slots is not None else positions, dst, h,
        1 if table is None else table.shape[0], rows.stride(0), rows.stride(1),
        dst.stride(0), dst.stride(1), 0.0 if eps is None else eps, D=d, ROPE=rope,
        BLOCK_H=block_h, BLOCK_D=block_d, NORM=eps is not None, WEIGHT=weight is not None,
        INVERSE=inverse, SCATTER=slots is not None, FP8_NOPE=fp8_nope, FP8_BLOCK=FP8_BLOCK,
        num_warps=4 if block_h * block_d <= 2048 else 8, **pdl_launch(x))


def q_kv_rms_rotary_triton(q: torch.Tensor, kv: torch.Tensor, kv_weight: torch.Tensor,
                           positions: torch.Tensor, table: torch.Tensor, pool: torch.Tensor,
                           slots: torch.Tensor, *, eps: float,
                           fp8_rope_dims: int | None = None) -> torch.Tensor:
    """`q_kv_rms_rotary_ref`'s contract in one launch: q [T, H, D] (rows may be strided) normed
    per head and rotated into a new tensor; kv [T, D] normed with kv_weight, rotated (and with
    `fp8_rope_dims` rounded) into rows `slots` of pool [S, D]."""
    t, h, d = q.shape
    if (kv.shape != (t, d) or pool.dim() != 2 or pool.shape[1] != d or q.stride(2) != 1
            or kv.stride(1) != 1 or pool.stride(1) != 1 or table.shape[1] > d
            or table.shape[1] % 2 or d % 2 or kv_weight.shape != (d,)):
        raise ValueError(f"q_kv_rms_rotary: need q [T, H, D], kv [T, D], pool [S, D] with D "
                         f"contiguous and a table of at most D (even) columns; got "
                         f"{tuple(q.shape)}, {tuple(kv.shape)}, {tuple(pool.shape)}, "
                         f"table {tuple(table.shape)}")
    nope = 0 if fp8_rope_dims is None else d - fp8_rope_dims
    if fp8_rope_dims is not None and (nope <= 0 or nope % FP8_BLOCK):
        raise ValueError(f"FP8 rounding takes rows whose {nope} non-rotary values are whole "
                         f"blocks of {FP8_BLOCK}")
    out = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    if t == 0:
        return out
    block_d = triton.next_power_of_2(d)
    block_h = max(1, min(triton.next_power_of_2(h), 4096 // block_d))
    q_tiles = triton.cdiv(h, block_h)
    _q_kv_kernel[(t, q_tiles + 1)](
        q, kv, kv_weight, table, positions, slots, out, pool, h, table.shape[0], q.stride(0),
        q.stride(1), kv.stride(0), pool.stride(0), eps, D=d, ROPE=table.shape[1],
        BLOCK_H=block_h, BLOCK_D=block_d, Q_TILES=q_tiles, FP8_NOPE=nope,
        FP8_BLOCK=FP8_BLOCK, num_warps=4 if block_h * block_d <= 2048 else 8, **pdl_launch(q))
    return out


def rms_rotary_triton(x: torch.Tensor, weight: torch.Tensor | None, positions: torch.Tensor,
                      table: torch.Tensor | None, *, eps: float | None,
                      inverse: bool = False) -> torch.Tensor:
    """`rms_rotary_ref`'s contract: x [T, D] or [T, H, D] (rows may be strided, D
    contiguous) -> a new contiguous tensor of x's shape and dtype."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, weight, positions, table, eps, inverse, out, None)
    return out


def rms_rotary_scatter_triton(x: torch.Tensor, weight: torch.Tensor | None,
                              positions: torch.Tensor, table: torch.Tensor | None,
                              pool: torch.Tensor, slots: torch.Tensor, *,
                              eps: float | None, fp8_rope_dims: int | None = None) -> None:
    """`rms_rotary_scatter_ref`'s contract: x [T, D] into rows `slots` of pool [S, D] (a
    negative slot skips its token), with `fp8_rope_dims` the rows' FP8 rounding too."""
    if x.dim() != 2 or pool.dim() != 2 or pool.shape[1] != x.shape[1]:
        raise ValueError(f"rms_rotary_scatter: need x [T, D] and pool [S, D], got "
                         f"{tuple(x.shape)} and {tuple(pool.shape)}")
    nope = 0 if fp8_rope_dims is None else x.shape[1] - fp8_rope_dims
    if fp8_rope_dims is not None and (nope <= 0 or nope % FP8_BLOCK):
        raise ValueError(f"FP8 rounding takes rows whose {nope} non-rotary values are whole "
                         f"blocks of {FP8_BLOCK}")
    _launch(x, weight, positions, table, eps, False, pool, slots, nope)
