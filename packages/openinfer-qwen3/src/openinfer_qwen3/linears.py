"""The Qwen3 forward's products, by the weight's type: a plain tensor goes through the ops of
openinfer-kernels (`linear`, and the fused `linear_silu_mul` / `linear_add_rms_norm`); a kept
FP8 linear (`Fp8BlockWeight`) through `fp8_dynamic_linear` (decode-size products read the
activations as they are against the weight dequantized in registers, prompt-size ones quantize
them per 128-column group and multiply in FP8: openinfer_kernels.fp8_linear.dynamic). The
fused products have FP8 forms for the weight-only (decode-size) path:
`fp8_block_linear_silu_mul` (silu * mul in the product's epilogue, or in its split-K sum) and
`fp8_block_linear_add_rms_norm` (a split product's shares summed by the add + norm kernel);
prompt-size products that quantize their activations run the W8A8 product, then the rest
(`silu_and_mul`, `fused_add_rms_norm`). Where the next product also runs W8A8
(`takes_quantized`), that rest quantizes its output for it in the same kernel
(`silu_mul_group_quant`, `add_rms_norm_group_quant`, `rms_norm_group_quant`) and hands over an
`Fp8Activation` rather than a bf16 activation the product would read back to quantize; the
same bits either way. OPENINFER_FP8_FUSED_QUANT=0 keeps them apart (an A/B)."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from openinfer_core.weights.fp8_checkpoint import Fp8BlockWeight
from openinfer_kernels import (
    fused_add_rms_norm,
    linear,
    linear_add_rms_norm,
    linear_silu_mul,
    rms_norm,
    silu_and_mul,
)
from openinfer_kernels.fp8_linear import (
    Fp8Activation,
    add_rms_norm_group_quant,
    fp8_block_linear_add_rms_norm,
    fp8_block_linear_silu_mul,
    fp8_dynamic_linear,
    quantizes_activations,
    rms_norm_group_quant,
    silu_mul_group_quant,
)
from openinfer_qwen3.fp8_weights import Linear

FUSED_QUANT_ENV = "OPENINFER_FP8_FUSED_QUANT"  # 1 (default) | 0: quantize in the product
QUANT_GROUP = 128  # the columns one activation scale covers (fp8_group_quant's group)
QUANT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what the fused kernels take

Activation = torch.Tensor | Fp8Activation


def takes_quantized(w: Linear, x: torch.Tensor) -> bool:
    """Whether the product of activation rows like `x` ([T, K]) by `w` runs W8A8 on whole
    128-column groups, so that the kernel making its input may hand it over quantized (read
    at each call, as `quantizes_activations` is)."""
    return (isinstance(w, Fp8BlockWeight) and quantizes_activations(x.shape[0])
            and w.weight.shape[1] % QUANT_GROUP == 0 and x.dtype in QUANT_DTYPES
            and os.environ.get(FUSED_QUANT_ENV, "1") != "0")


def norm(x: torch.Tensor, weight: torch.Tensor, eps: float, quantize: bool) -> Activation:
    """rms_norm(x) * weight, quantized for a W8A8 product when `quantize`."""
    if not quantize:
        return rms_norm(x, weight, eps)
    q, scale = rms_norm_group_quant(x, weight, eps)
    return Fp8Activation(q, scale, x.dtype)


def project(x: Activation, w: Linear, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w.T (+ bias) -> [M, N] in x's dtype (an `Fp8Activation` only where
    `takes_quantized`)."""
    if isinstance(w, Fp8BlockWeight):
        out = fp8_dynamic_linear(x, w.weight, w.scale)
        return out if bias is None else out.add_(bias)
    assert isinstance(x, torch.Tensor)
    return linear(x, w) if bias is None else F.linear(x, w, bias)


def project_wide(x: torch.Tensor, w: Linear, wide: torch.dtype) -> torch.Tensor:
    """x @ w.T in `wide` (activations and weight widened first), left in `wide`."""
    if isinstance(w, Fp8BlockWeight):
        return fp8_dynamic_linear(x.to(wide), w.weight, w.scale)
    return F.linear(x.to(wide), w.to(wide))


def project_silu_mul(x: Activation, w: Linear, quantize: bool = False) -> Activation:
    """silu(gate) * up of a gated MLP's [gate; up] weight ([2I, K]) -> [M, I]; with
    `quantize` (the next product `takes_quantized`) an `Fp8Activation` where this product runs
    W8A8 too."""
    if isinstance(w, Fp8BlockWeight):
        if isinstance(x, Fp8Activation) or quantizes_activations(x.shape[0]):
            product = fp8_dynamic_linear(x, w.weight, w.scale)
            if quantize and product.shape[1] % (2 * QUANT_GROUP) == 0:
                q, scale = silu_mul_group_quant(product)
                return Fp8Activation(q, scale, product.dtype)
            return silu_and_mul(product)
        return fp8_block_linear_silu_mul(x, w.weight, w.scale)
    assert isinstance(x, torch.Tensor)
    return linear_silu_mul(x, w)


def project_add_rms_norm(x: Activation, w: Linear, residual: torch.Tensor,
                         norm_weight: torch.Tensor, eps: float, quantize: bool = False
                         ) -> tuple[Activation, torch.Tensor]:
    """(rms_norm(x @ w.T + residual), x @ w.T + residual); with `quantize` (the next product
    `takes_quantized`) the normed rows as an `Fp8Activation` where this product runs W8A8."""
    if isinstance(w, Fp8BlockWeight):
        if isinstance(x, Fp8Activation) or quantizes_activations(x.shape[0]):
            out = fp8_dynamic_linear(x, w.weight, w.scale)
            if quantize and out.shape[1] % QUANT_GROUP == 0:
                q, scale, summed = add_rms_norm_group_quant(out, residual, norm_weight, eps)
                return Fp8Activation(q, scale, out.dtype), summed
            return fused_add_rms_norm(out, residual, norm_weight, eps)
        return fp8_block_linear_add_rms_norm(x, w.weight, w.scale, residual, norm_weight, eps)
    assert isinstance(x, torch.Tensor)
    return linear_add_rms_norm(x, w, residual, norm_weight, eps)
