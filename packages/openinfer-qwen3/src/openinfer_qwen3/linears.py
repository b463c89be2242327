"""The Qwen3 forward's products, by the weight's type: a plain tensor goes through the ops of
openinfer-kernels (`linear`, and the fused `linear_silu_mul` / `linear_add_rms_norm`); a kept
FP8 linear (`Fp8BlockWeight`) through `fp8_dynamic_linear` (decode-size products read the
activations as they are against the weight dequantized in registers, prompt-size ones quantize
them per 128-column group and multiply in FP8: openinfer_kernels.fp8_linear.dynamic). The
fused products have FP8 forms for the weight-only (decode-size) path:
`fp8_block_linear_silu_mul` (silu * mul in the product's epilogue, or in its split-K sum) and
`fp8_block_linear_add_rms_norm` (a split product's shares summed by the add + norm kernel);
prompt-size products that quantize their activations run the W8A8 product, then the unfused
rest (`silu_and_mul`, `fused_add_rms_norm`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from openinfer_core.weights.fp8_checkpoint import Fp8BlockWeight
from openinfer_kernels import (
    fused_add_rms_norm,
    linear,
    linear_add_rms_norm,
    linear_silu_mul,
    silu_and_mul,
)
from openinfer_kernels.fp8_linear import (
    fp8_block_linear_add_rms_norm,
    fp8_block_linear_silu_mul,
    fp8_dynamic_linear,
    quantizes_activations,
)
from openinfer_qwen3.fp8_weights import Linear


def project(x: torch.Tensor, w: Linear, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w.T (+ bias) -> [M, N] in x's dtype."""
    if isinstance(w, Fp8BlockWeight):
        out = fp8_dynamic_linear(x, w.weight, w.scale)
        return out if bias is None else out.add_(bias)
    return linear(x, w) if bias is None else F.linear(x, w, bias)


def project_wide(x: torch.Tensor, w: Linear, wide: torch.dtype) -> torch.Tensor:
    """x @ w.T in `wide` (activations and weight widened first), left in `wide`."""
    if isinstance(w, Fp8BlockWeight):
        return fp8_dynamic_linear(x.to(wide), w.weight, w.scale)
    return F.linear(x.to(wide), w.to(wide))


def project_silu_mul(x: torch.Tensor, w: Linear) -> torch.Tensor:
    """silu(gate) * up of a gated MLP's [gate; up] weight ([2I, K]) -> [M, I]."""
    if isinstance(w, Fp8BlockWeight):
        if quantizes_activations(x.shape[0]):
            return silu_and_mul(fp8_dynamic_linear(x, w.weight, w.scale))
        return fp8_block_linear_silu_mul(x, w.weight, w.scale)
    return linear_silu_mul(x, w)


def project_add_rms_norm(x: torch.Tensor, w: Linear, residual: torch.Tensor,
                         norm_weight: torch.Tensor, eps: float
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x @ w.T + residual), x @ w.T + residual)."""
    if isinstance(w, Fp8BlockWeight):
        if quantizes_activations(x.shape[0]):
            return fused_add_rms_norm(fp8_dynamic_linear(x, w.weight, w.scale), residual,
                                      norm_weight, eps)
        return fp8_block_linear_add_rms_norm(x, w.weight, w.scale, residual, norm_weight, eps)
    return linear_add_rms_norm(x, w, residual, norm_weight, eps)
