"""The cache's quantized rows: the rounding of `reference.py` kept as the codes themselves, so
that reading a row back (`decode_rows`) gives exactly what the rounding gives (`fp8_round_nope`,
`indexer_round_ref`), in a quarter to a half of the bytes. Row layouts (one uint8 row each):

- `Fp8Entries` (a main compressed entry of D dims, the last `rope` of them rotary): the D - rope
  non-rotary values as e4m3 codes, the rotary values in the model's dtype (little-endian, as
  stored), then one scale byte per 64 values, zero bytes up to a multiple of 8. A scale is a
  power of two, 2^(byte - 127) (E8M0: one byte holds every scale the rounding makes, 2^-126
  up, exactly; fp32 would take four). V4-Flash (512 dims, 64 rotary, bf16): 448 + 128 + 7 + 1
  = 584 bytes.
- `Fp4Keys` (an indexer key of d dims, Hadamard-rotated): the d values as e2m1 codes, two to a
  byte (the even value in the low nibble), then one E8M0 scale byte per 32 values. d = 128:
  64 + 4 = 68 bytes.

`encode_rows(values, fmt)` makes the rows (for the indexer: rotated first), `decode_rows(rows,
fmt, dtype)` reads them back in the model's dtype; the Triton forms are in `storage_triton.py`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openinfer_deepseek_v4.kernels.quant_sim.reference import (
    _FP4_VALUES,
    FP4_BLOCK,
    FP4_MAX,
    FP8_BLOCK,
    FP8_MAX,
    _fp4_tables,
    _pow2_scale,
    hadamard,
)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True, slots=True)
class Fp8Entries:
    """The row layout of main compressed entries stored in FP8 (module docstring)."""

    dim: int
    rope: int
    rope_bytes: int  # the model dtype's element size: 2 (bf16) or 4 (fp32)

    def __post_init__(self) -> None:
        if self.nope % FP8_BLOCK or self.nope <= 0:
            raise ValueError(f"FP8 entries need the {self.nope} non-rotary dims in whole "
                             f"blocks of {FP8_BLOCK}")

    @property
    def nope(self) -> int:
        return self.dim - self.rope

    @property
    def scale_offset(self) -> int:
        return self.nope + self.rope * self.rope_bytes

    @property
    def row_bytes(self) -> int:
        return _round_up(self.scale_offset + self.nope // FP8_BLOCK, 8)


@dataclass(frozen=True, slots=True)
class Fp4Keys:
    """The row layout of indexer keys stored in FP4 (module docstring)."""

    dim: int

    def __post_init__(self) -> None:
        if self.dim % FP4_BLOCK or self.dim & (self.dim - 1):
            raise ValueError(f"FP4 keys need a power-of-two multiple of {FP4_BLOCK} dims, "
                             f"got {self.dim}")

    @property
    def scale_offset(self) -> int:
        return self.dim // 2

    @property
    def row_bytes(self) -> int:
        return self.dim // 2 + self.dim // FP4_BLOCK


RowFormat = Fp8Entries | Fp4Keys


def _scale_bytes(scale: torch.Tensor) -> torch.Tensor:
    """Powers of two (fp32) -> their E8M0 bytes: the biased exponent."""
    return ((scale.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


def _byte_scales(codes: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> fp32 powers of two."""
    return (codes.to(torch.int32) << 23).view(torch.float32)


def _fp8_encode(x: torch.Tensor, fmt: Fp8Entries) -> torch.Tensor:
    """x [N, D] in the model's dtype -> [N, row_bytes] uint8; `fp8_round`'s steps."""
    blocks = x[:, :fmt.nope].float().unflatten(-1, (-1, FP8_BLOCK))
    scale = _pow2_scale(blocks.abs().amax(-1, keepdim=True).clamp(min=1e-4), FP8_MAX)
    codes = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    rope = x[:, fmt.nope:].contiguous().view(torch.uint8)
    out = x.new_zeros((x.shape[0], fmt.row_bytes), dtype=torch.uint8)
    out[:, :fmt.nope] = codes.flatten(-2).view(torch.uint8)
    out[:, fmt.nope:fmt.scale_offset] = rope
    out[:, fmt.scale_offset:fmt.scale_offset + fmt.nope // FP8_BLOCK] = _scale_bytes(scale[..., 0])
    return out


def _fp8_decode(rows: torch.Tensor, fmt: Fp8Entries, dtype: torch.dtype) -> torch.Tensor:
    codes = rows[:, :fmt.nope].contiguous().view(torch.float8_e4m3fn).float()
    scale = _byte_scales(rows[:, fmt.scale_offset:fmt.scale_offset + fmt.nope // FP8_BLOCK])
    nope = (codes.unflatten(-1, (-1, FP8_BLOCK)) * scale[..., None]).flatten(-2).to(dtype)
    rope = rows[:, fmt.nope:fmt.scale_offset].contiguous().view(dtype)
    return torch.cat([nope, rope], dim=-1)


def _fp4_encode(x: torch.Tensor, fmt: Fp4Keys) -> torch.Tensor:
    """x [N, d] in the model's dtype -> [N, row_bytes] uint8: `indexer_round_ref`'s steps."""
    blocks = hadamard(x).float().unflatten(-1, (-1, FP4_BLOCK))
    amax = blocks.abs().amax(-1, keepdim=True).clamp(min=FP4_MAX * 2.0 ** -126)
    scale = _pow2_scale(amax, FP4_MAX)
    scaled = (blocks / scale).clamp(-FP4_MAX, FP4_MAX)
    magnitude = scaled.abs()
    table = _fp4_tables(x.device)
    code = torch.bucketize(magnitude, table[1]) + torch.isin(magnitude, table[2]).long()
    nibbles = (code | (torch.signbit(scaled).long() << 3)).flatten(-2)  # e2m1 codes, in order
    out = x.new_empty((x.shape[0], fmt.row_bytes), dtype=torch.uint8)
    out[:, :fmt.scale_offset] = (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).to(torch.uint8)
    out[:, fmt.scale_offset:] = _scale_bytes(scale[..., 0])
    return out


def _fp4_decode(rows: torch.Tensor, fmt: Fp4Keys, dtype: torch.dtype) -> torch.Tensor:
    packed = rows[:, :fmt.scale_offset].long()
    nibbles = torch.stack([packed & 15, packed >> 4], dim=-1).flatten(-2)
    values = torch.tensor(_FP4_VALUES, device=rows.device)[nibbles & 7]
    values = values.copysign(1.0 - 2.0 * (nibbles >> 3).float())
    scale = _byte_scales(rows[:, fmt.scale_offset:])
    return (values.unflatten(-1, (-1, FP4_BLOCK)) * scale[..., None]).flatten(-2).to(dtype)


def encode_rows(values: torch.Tensor, fmt: RowFormat) -> torch.Tensor:
    """values [N, dim] in the model's dtype -> [N, row_bytes] uint8 rows of `fmt`."""
    if isinstance(fmt, Fp8Entries):
        return _fp8_encode(values, fmt)
    return _fp4_encode(values, fmt)


def decode_rows(rows: torch.Tensor, fmt: RowFormat, dtype: torch.dtype) -> torch.Tensor:
    """rows [N, row_bytes] uint8 of `fmt` -> [N, dim] in `dtype`: equal to the rounding of
    the values they were made from (`fp8_round_nope`, `indexer_round_ref`)."""
    if isinstance(fmt, Fp8Entries):
        return _fp8_decode(rows, fmt, dtype)
    return _fp4_decode(rows, fmt, dtype)


def stored_rows(pool: torch.Tensor, rows: torch.Tensor, fmt: RowFormat | None,
                dtype: torch.dtype) -> torch.Tensor:
    """Rows `rows` (int, >= 0) of a flat pool [S, width], as values in `dtype`: decoded with
    `fmt`, or as they are (None: stored in the model's dtype)."""
    picked = pool[rows.long()]
    if fmt is None:
        return picked
    return decode_rows(picked.flatten(0, -2), fmt, dtype).unflatten(0, picked.shape[:-1])
