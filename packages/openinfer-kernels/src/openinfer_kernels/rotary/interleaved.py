"""Rotary position embedding in DeepSeek-V4's convention: only the last R dims of a head rotate,
as consecutive pairs (x[2i], x[2i+1]) by angle position * f_i, with f_i = theta^(-2i/R); the
layers with compressed KV stretch the slow frequencies by YaRN (spec: shared deepseek-v4.md §13).
The attention output's rotary dims are rotated back (by -position), since K doubles as V."""

from __future__ import annotations

import math

import torch


def rope_frequencies(rope_dim: int, theta: float, *, yarn_factor: float = 1.0,
                     original_max_positions: int = 0, beta_fast: float = 32.0,
                     beta_slow: float = 1.0) -> torch.Tensor:
    """The R/2 frequencies f_i, fp32. With `yarn_factor` > 1, YaRN: frequencies that turn fewer
    than `beta_slow` times over `original_max_positions` are divided by the factor, those that
    turn more than `beta_fast` times are kept, and a linear ramp blends the ones between (no
    attention-scale correction)."""
    freqs = 1.0 / theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim)
    if yarn_factor <= 1.0:
        return freqs

    def pair_index(turns: float) -> float:  # the pair i that turns `turns` times
        return (rope_dim * math.log(original_max_positions / (turns * 2 * math.pi))
                / (2 * math.log(theta)))

    low = max(math.floor(pair_index(beta_fast)), 0)
    high = min(math.ceil(pair_index(beta_slow)), rope_dim - 1)
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float32) - low)
            / max(high - low, 1e-3)).clamp(0, 1)
    return freqs / yarn_factor * ramp + freqs * (1 - ramp)


def rotary_interleaved_ref(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, *,
                           inverse: bool = False) -> torch.Tensor:
    """Rotate the last 2 * len(freqs) dims of x ([T, ..., D]) pairwise by positions ([T]) * f
    (by minus that with `inverse`), in fp32 with cos/sin rounded to x's dtype first (as
    transformers does); the leading dims pass unchanged."""
    angles = positions.float()[:, None] * freqs.to(positions.device)  # [T, R/2]
    if inverse:
        angles = -angles
    return rotate_pairs(x, angles.cos().to(x.dtype).float(), angles.sin().to(x.dtype).float())


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The last R dims of x [T, ..., D] rotated as pairs (x[2i], x[2i+1]) by cos and sin
    ([T, R/2] fp32, one angle per pair), in fp32; the leading dims pass unchanged."""
    rope_dim = 2 * cos.shape[1]
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[1],)
    cos, sin = cos.view(shape), sin.view(shape)
    rope = x[..., -rope_dim:].float()
    even, odd = rope[..., 0::2], rope[..., 1::2]
    rotated = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)
    return torch.cat([x[..., :-rope_dim], rotated.to(x.dtype)], dim=-1)
