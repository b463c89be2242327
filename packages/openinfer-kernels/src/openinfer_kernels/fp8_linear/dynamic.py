"""Which FP8 linear a product of a given number of rows takes, for checkpoints whose activations
are quantized on the fly (HF's `activation_scheme: dynamic`): few rows (decode) read the
activations as they are against the weight dequantized in registers (`fp8_block_linear`,
bound by the weight read, and the more exact of the two); many rows (prefill) quantize them
per 128-column group and multiply on the FP8 tensor cores (`fp8_group_quant`, then
`fp8_w8a8_linear`), bound by the MMA rate, which FP8 doubles.

OPENINFER_FP8_LINEAR forces one path for every row count (benchmarks): `auto` (the default)
chooses by W8A8_MIN_ROWS, `w8a8` always quantizes, `weight-only` never does.

An activation may also come quantized already (`Fp8Activation`, from a kernel that made it
and quantized it in one pass: `quant_fused.py`); the product then takes it as it is."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

FP8_LINEAR_ENV = "OPENINFER_FP8_LINEAR"
PATHS = ("auto", "w8a8", "weight-only")
# Rows from which `auto` quantizes the activations: on an H100 at Qwen3-8B's shapes, the W8A8
# product (cuBLASLt) overtakes the weight-only kernel at 32-64 rows for the qkv, o and down
# projections (benchmarks/device/fp8_gemm.py --sweep); below it decode keeps the more exact
# weight-only product.
W8A8_MIN_ROWS = 64

BlockLinear = Callable[..., torch.Tensor]  # (x, w, scale, out_dtype) -> [M, N]
GroupQuant = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
W8a8Linear = Callable[..., torch.Tensor]  # (xq, x_scale, w, scale, out_dtype) -> [M, N]


@dataclass(frozen=True, slots=True)
class Fp8Activation:
    """An activation quantized for the W8A8 product: `fp8_group_quant`'s (e4m3 [M, K], fp32
    scales [M, ceil(K/128)], in its layout), and the dtype the activation had (the product's
    output dtype by default)."""

    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.q.shape


def quantizes_activations(rows: int) -> bool:
    """Whether a product of `rows` rows takes the W8A8 path, by OPENINFER_FP8_LINEAR (read at
    each call, so a CUDA graph holds the path chosen when it was captured)."""
    path = os.environ.get(FP8_LINEAR_ENV) or "auto"
    if path == "auto":
        return rows >= W8A8_MIN_ROWS
    if path not in PATHS:
        raise ValueError(f"{FP8_LINEAR_ENV} must be one of {', '.join(PATHS)}, not {path!r}")
    return path == "w8a8"


def dynamic_linear(block_linear: BlockLinear, group_quant: GroupQuant,
                   w8a8_linear: W8a8Linear) -> Callable[..., torch.Tensor]:
    """The FP8 linear over the given ops (the dispatching ones, the references or the Triton
    kernels): x [M, K] times w [N, K] e4m3 with its block scales -> [M, N] in `out_dtype`
    (default x's), through `block_linear` or quantize-then-`w8a8_linear` by M; an
    `Fp8Activation` x straight through `w8a8_linear`."""

    def fp8_dynamic_linear(x: torch.Tensor | Fp8Activation, w: torch.Tensor,
                           scale: torch.Tensor, out_dtype: torch.dtype | None = None
                           ) -> torch.Tensor:
        if isinstance(x, Fp8Activation):
            return w8a8_linear(x.q, x.scale, w, scale, out_dtype or x.dtype)
        if quantizes_activations(x.shape[0]):
            xq, x_scale = group_quant(x)
            return w8a8_linear(xq, x_scale, w, scale, out_dtype or x.dtype)
        return block_linear(x, w, scale, out_dtype)

    return fp8_dynamic_linear
