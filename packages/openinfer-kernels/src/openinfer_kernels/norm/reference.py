"""RMSNorm and its fused variants, fp32 math, output in the input's dtype."""

from __future__ import annotations

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension."""
    xf = x.float()
    inv_rms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    # The normalised value is rounded to x's dtype before the weight (transformers' order).
    return ((xf * inv_rms).to(x.dtype).float() * weight.float()).to(x.dtype)


def fused_add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the pre-norm residual stream in one pass."""
    summed = (x.float() + residual.float()).to(x.dtype)
    return rms_norm_ref(summed, weight, eps), summed


def qk_rms_norm_ref(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                    k_weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm of q ([T, Hq, D]) and k ([T, Hk, D]) over D (Qwen3's q_norm/k_norm)."""
    return rms_norm_ref(q, q_weight, eps), rms_norm_ref(k, k_weight, eps)
