# mypy: disable-error-code="no-untyped-def"
"""The cache's quantized rows (`storage.py`) inside Triton kernels: `store_fp8_entry` and
`store_fp4_key` write one row from its values (the compressor's pooling calls them as it makes
an entry), `load_fp8_rows` and `load_fp4_rows` read rows back as values in the model's dtype
(sparse attention, the indexer's scores). Each rounds as `triton.py`'s kernels do (integer and
exact-fp32 arithmetic only, no FP8/FP4 casts: the compiled kernel and the interpreter agree),
then takes the code's bits from the rounded value, which the format holds exactly.
`encode_rows_triton` / `decode_rows_triton` launch them over rows (`storage.py`'s
`encode_rows` / `decode_rows`' contracts), for the tests. (The mypy
line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_deepseek_v4.kernels.quant_sim.reference import hadamard_matrix
from openinfer_deepseek_v4.kernels.quant_sim.storage import Fp8Entries, RowFormat


@triton.jit
def pow2_ceil(x):
    """2^ceil(log2 x) for x > 0 in fp32: the exponent, plus one unless the mantissa is 0."""
    bits = x.to(tl.uint32, bitcast=True)
    e = ((bits >> 23) & 0xFF).to(tl.int32) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    return ((e + 127) << 23).to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def round_to_format(v, TOP: tl.constexpr, MIN_EXP: tl.constexpr, MANT: tl.constexpr):
    """v (fp32, already divided by its block's scale) clamped to +-TOP and rounded to the
    format with MANT mantissa bits whose smallest normal exponent is MIN_EXP. The sign is v's
    sign bit put back on the rounded magnitude as bits, so a negative value that rounds to zero
    keeps -0 (the code torch's cast gives): compiled, a float negation of 0 may lose it."""
    sign = v.to(tl.uint32, bitcast=True) & 0x80000000
    a = tl.minimum(tl.abs(v), TOP)
    e = ((a.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32) - 127
    e = tl.maximum(e, MIN_EXP) - MANT
    q = ((e + 127) << 23).to(tl.uint32).to(tl.float32, bitcast=True)
    t = a / q  # exact: q is a power of two, t < 2^(MANT + 1)
    whole = t.to(tl.int32)  # t >= 0: the floor
    frac = t - whole.to(tl.float32)
    up = (frac > 0.5) | ((frac == 0.5) & ((whole & 1) == 1))
    r = (whole + up.to(tl.int32)).to(tl.float32) * q
    return (r.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _codes(r, BIAS: tl.constexpr, MANT: tl.constexpr, EXP_BITS: tl.constexpr,
           MIN_NORMAL: tl.constexpr):
    """The sign | exponent | mantissa code (int32) of r, a value of a small float format with
    exponent bias BIAS, MANT mantissa bits, EXP_BITS exponent bits and smallest normal
    MIN_NORMAL."""
    a = tl.abs(r)
    bits = a.to(tl.uint32, bitcast=True)
    e = ((bits >> 23) & 0xFF).to(tl.int32) - 127
    normal = ((e + BIAS) << MANT) | ((bits >> (23 - MANT)) & ((1 << MANT) - 1)).to(tl.int32)
    subnormal = (a * ((1 << MANT) / MIN_NORMAL)).to(tl.int32)  # a multiple of the quantum
    code = tl.where(a >= MIN_NORMAL, normal, subnormal)
    sign = (r.to(tl.uint32, bitcast=True) >> 31).to(tl.int32)
    return code | (sign << (MANT + EXP_BITS))


@triton.jit
def _values(code, BIAS: tl.constexpr, MANT: tl.constexpr, EXP_BITS: tl.constexpr,
            MIN_NORMAL: tl.constexpr):
    """`_codes` undone: int32 codes -> fp32 values."""
    e = (code >> MANT) & ((1 << EXP_BITS) - 1)
    m = code & ((1 << MANT) - 1)
    normal = (((e + 127 - BIAS) << 23) | (m << (23 - MANT))).to(tl.uint32)
    a = tl.where(e == 0, m.to(tl.float32) * (MIN_NORMAL / (1 << MANT)),
                 normal.to(tl.float32, bitcast=True))
    return tl.where(((code >> (MANT + EXP_BITS)) & 1) != 0, -a, a)


@triton.jit
def fp8_codes(v):
    """v (fp32, divided by its block's scale) -> the int32 e4m3 codes of its rounding."""
    return _codes(round_to_format(v, 448.0, -6, 3), 7, 3, 4, 0.015625)


@triton.jit
def fp8_values(code):
    return _values(code.to(tl.int32), 7, 3, 4, 0.015625)


@triton.jit
def fp4_codes(v):
    """v (fp32, divided by its block's scale) -> the int32 e2m1 codes of its rounding."""
    return _codes(round_to_format(v, 6.0, 0, 1), 1, 1, 2, 1.0)


@triton.jit
def fp4_values(code):
    return _values(code.to(tl.int32), 1, 1, 2, 1.0)


@triton.jit
def scale_byte(scale):
    """A power of two (fp32) -> its E8M0 byte."""
    return ((scale.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.uint8)


@triton.jit
def byte_scale(byte):
    """An E8M0 byte -> its power of two (fp32)."""
    return (byte.to(tl.int32) << 23).to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def store_fp8_entry(row_ptr, y, ok, D: tl.constexpr, NOPE: tl.constexpr,
                    ROPE_BYTES: tl.constexpr, SCALE_OFF: tl.constexpr, BLOCK_D: tl.constexpr):
    """Write entry y ([BLOCK_D] in the model's dtype, values past D ignored) as an
    `Fp8Entries` row at `row_ptr` (uint8) where `ok`: `fp8_round_nope`'s codes."""
    blocks = tl.reshape(y.to(tl.float32), [BLOCK_D // 64, 64])
    k = tl.arange(0, BLOCK_D // 64)
    cols = k[:, None] * 64 + tl.arange(0, 64)[None, :]
    amax = tl.maximum(tl.max(tl.abs(blocks), axis=1), 1e-4)
    scale = pow2_ceil(amax * (1.0 / 448.0))
    codes = fp8_codes(blocks / scale[:, None]).to(tl.uint8)
    # the masks compare with a bound that `ok` zeroes (a scalar condition, any dtype)
    nope = tl.where(ok, NOPE, 0)
    tl.store(row_ptr + cols, codes, mask=cols < nope)
    tl.store(row_ptr + SCALE_OFF + k, scale_byte(scale), mask=k < nope // 64)
    # the rotary dims as stored in the model's dtype: the top ROPE_BYTES bytes of their fp32
    # bits, little-endian
    d = tl.arange(0, BLOCK_D)
    bits = y.to(tl.float32).to(tl.uint32, bitcast=True) >> (32 - 8 * ROPE_BYTES)
    i = tl.arange(0, ROPE_BYTES)
    byte = ((bits[:, None] >> (8 * i[None, :]).to(tl.uint32)) & 0xFF).to(tl.uint8)
    rope = (d >= NOPE) & (d < tl.where(ok, D, 0))
    tl.store(row_ptr + NOPE + (d - NOPE)[:, None] * ROPE_BYTES + i[None, :], byte,
             mask=rope[:, None])


@triton.jit
def load_fp8_rows(rows_ptr, valid, offs_d, D: tl.constexpr, NOPE: tl.constexpr,
                  SCALE_OFF: tl.constexpr, TY: tl.constexpr):
    """`Fp8Entries` rows starting at rows_ptr ([N] uint8 pointers; `valid` [N]) -> [N,
    len(offs_d)] values in TY (the model's dtype; 0 where not valid or past D)."""
    base = rows_ptr[:, None]
    nope = valid[:, None] & (offs_d < NOPE)[None, :]
    codes = tl.load(base + offs_d[None, :], mask=nope, other=0)
    scale = byte_scale(tl.load(base + SCALE_OFF + offs_d[None, :] // 64, mask=nope, other=127))
    rope_ok = valid[:, None] & ((offs_d >= NOPE) & (offs_d < D))[None, :]
    rope = tl.load((base + NOPE).to(tl.pointer_type(TY)) + (offs_d - NOPE)[None, :],
                   mask=rope_ok, other=0.0)
    values = tl.where((offs_d < NOPE)[None, :], fp8_values(codes) * scale, rope.to(tl.float32))
    return values.to(TY)


@triton.jit
def store_fp4_key(row_ptr, y, h_ptr, ok, D: tl.constexpr):
    """Write indexer key y ([D] in the model's dtype) as an `Fp4Keys` row at `row_ptr`
    (uint8) where `ok`: rotated (the fp32 product with the d x d Hadamard matrix `h_ptr`, as
    `triton.py`'s indexer kernel computes it, in the model's dtype), then e2m1 codes per 32
    with their scales."""
    cols = tl.arange(0, D)
    h = tl.load(h_ptr + cols[:, None] * D + cols[None, :])
    x = tl.broadcast_to(y.to(tl.float32)[None, :], [16, D])  # tl.dot takes 16 rows at least
    rotated = tl.max(tl.dot(x, h, input_precision="ieee"), axis=0)  # 16 equal rows: one
    rotated = rotated.to(y.dtype).to(tl.float32)
    blocks = tl.reshape(rotated, [D // 32, 32])
    amax = tl.maximum(tl.max(tl.abs(blocks), axis=1), 6.0 * 1.1754943508222875e-38)
    scale = pow2_ceil(amax * (1.0 / 6.0))
    codes = tl.reshape(fp4_codes(blocks / scale[:, None]), [D // 2, 2])
    low, high = tl.split(codes)
    bound = tl.where(ok, D, 0)
    tl.store(row_ptr + tl.arange(0, D // 2), (low | (high << 4)).to(tl.uint8),
             mask=tl.arange(0, D // 2) < bound // 2)
    tl.store(row_ptr + D // 2 + tl.arange(0, D // 32), scale_byte(scale),
             mask=tl.arange(0, D // 32) < bound // 32)


@triton.jit
def load_fp4_rows(rows_ptr, valid, D: tl.constexpr, N: tl.constexpr, TY: tl.constexpr):
    """`Fp4Keys` rows starting at rows_ptr ([N] uint8 pointers; `valid` [N]) -> [N, D] values
    in TY (0 where not valid)."""
    base = rows_ptr[:, None]
    packed = tl.load(base + tl.arange(0, D // 2)[None, :], mask=valid[:, None], other=0)
    packed = packed.to(tl.int32)
    codes = tl.reshape(tl.join(packed & 15, packed >> 4), [N, D])
    d = tl.arange(0, D)
    scale = byte_scale(tl.load(base + D // 2 + d[None, :] // 32, mask=valid[:, None],
                               other=127))
    return (fp4_values(codes) * scale).to(TY)



@triton.jit
def _encode_kernel(x_ptr, out_ptr, h_ptr, stride_x, stride_out, D: tl.constexpr,
                   FP8: tl.constexpr, NOPE: tl.constexpr, ROPE_BYTES: tl.constexpr,
                   SCALE_OFF: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    y = tl.load(x_ptr + row * stride_x + d, mask=d < D, other=0.0)
    if FP8:
        store_fp8_entry(out_ptr + row * stride_out, y, True, D, NOPE, ROPE_BYTES, SCALE_OFF,
                        BLOCK_D)
    else:
        store_fp4_key(out_ptr + row * stride_out, y, h_ptr, True, D)


@triton.jit
def _decode_kernel(rows_ptr, out_ptr, num_rows, stride_row, stride_out, D: tl.constexpr,
                   FP8: tl.constexpr, NOPE: tl.constexpr, SCALE_OFF: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    i = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = i < num_rows
    starts = rows_ptr + i.to(tl.int64) * stride_row
    ty = out_ptr.dtype.element_ty
    d = tl.arange(0, BLOCK_D)
    if FP8:
        values = load_fp8_rows(starts, ok, d, D, NOPE, SCALE_OFF, ty)
    else:
        values = load_fp4_rows(starts, ok, D, BLOCK_M, ty)
    tl.store(out_ptr + i[:, None] * stride_out + d[None, :], values,
             mask=ok[:, None] & (d < D)[None, :])


def encode_rows_triton(values: torch.Tensor, fmt: RowFormat) -> torch.Tensor:
    """`storage.encode_rows`: values [N, dim] (contiguous rows) -> [N, row_bytes] uint8."""
    out = torch.zeros(values.shape[0], fmt.row_bytes, dtype=torch.uint8, device=values.device)
    if values.shape[0] == 0:
        return out
    fp8 = fmt if isinstance(fmt, Fp8Entries) else None
    _encode_kernel[(values.shape[0],)](
        values, out, hadamard_matrix(fmt.dim, values.device), values.stride(0), out.stride(0),
        D=fmt.dim, FP8=fp8 is not None, NOPE=0 if fp8 is None else fp8.nope,
        ROPE_BYTES=1 if fp8 is None else fp8.rope_bytes, SCALE_OFF=fmt.scale_offset,
        BLOCK_D=triton.next_power_of_2(fmt.dim))
    return out


def decode_rows_triton(rows: torch.Tensor, fmt: RowFormat, dtype: torch.dtype) -> torch.Tensor:
    """`storage.decode_rows`: rows [N, row_bytes] uint8 -> [N, dim] in dtype."""
    out = torch.empty(rows.shape[0], fmt.dim, dtype=dtype, device=rows.device)
    if rows.shape[0] == 0:
        return out
    fp8, block_m = fmt if isinstance(fmt, Fp8Entries) else None, 16
    _decode_kernel[(triton.cdiv(rows.shape[0], block_m),)](
        rows, out, rows.shape[0], rows.stride(0), out.stride(0), D=fmt.dim,
        FP8=fp8 is not None, NOPE=0 if fp8 is None else fp8.nope, SCALE_OFF=fmt.scale_offset,
        BLOCK_M=block_m, BLOCK_D=triton.next_power_of_2(fmt.dim))
    return out
