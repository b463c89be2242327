"""Rotary position embedding in Qwen3's (GPT-NeoX) convention: the head dimension is split into
two halves, and pair (i, i + D/2) is rotated by angle position * theta^(-2i/D)."""

from __future__ import annotations

import torch


def rope_cos_sin(max_positions: int, head_dim: int, theta: float,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """[max_positions, head_dim] fp32: cos of the D/2 frequencies, then their sin."""
    if head_dim % 2:
        raise ValueError(f"rotary head_dim must be even, got {head_dim}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    t = torch.arange(max_positions, dtype=torch.int64, device=device).float()
    angles = torch.outer(t, inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def rotary_embedding_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                         cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q ([T, Hq, D]) and k ([T, Hk, D]) by their tokens' `positions` ([T])."""
    half = q.shape[-1] // 2
    # cos and sin in q's dtype, as transformers applies them.
    table = cos_sin.index_select(0, positions).to(q.dtype).float()
    cos = table[:, None, :half]
    sin = table[:, None, half:]
    return _rotate(q, cos, sin), _rotate(k, cos, sin)
