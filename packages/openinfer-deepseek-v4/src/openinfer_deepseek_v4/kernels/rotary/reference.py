"""Rotary position embedding in DeepSeek-V4's convention, and its RMSNorm + rotary op.

The rotation: only the last R dims of a head rotate, as consecutive pairs (x[2i], x[2i+1]) by
angle position * f_i, with f_i = theta^(-2i/R); the layers with compressed KV stretch the slow
frequencies by YaRN (spec: shared deepseek-v4.md §13). The attention output's rotary dims are
rotated back (by -position), since K doubles as V.

The op (spec §5.1, §5.3, §13): the attention's low-rank query norm, the per-head weightless
query norm, the raw entry's norm, each followed (or not) by that rotation; the indexer's query
and the attention output (by minus the angle) are rotated without a norm. `rms_rotary_ref`
computes exactly what the model's reference does piece by piece (`rms_norm` in fp32 times the
fp32 weight, rounded once; then `rotary_interleaved_ref` in fp32 with cos and sin rounded to
the activations' dtype), except that cos and sin come from a table of every position made
once (`rope_table`) rather than from the angles each step."""

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


def rope_table(freqs: torch.Tensor, max_positions: int, dtype: torch.dtype) -> torch.Tensor:
    """[max_positions, R]: for each position p, cos(p f_i) then sin(p f_i) over the R/2
    frequencies `freqs`, from the fp32 angles p * f_i and rounded to `dtype` (the
    activations' dtype: `rotary_interleaved_ref` rounds cos and sin to it before use)."""
    positions = torch.arange(max_positions, device=freqs.device)
    angles = positions.float()[:, None] * freqs.float()
    return torch.cat([angles.cos().to(dtype), angles.sin().to(dtype)], dim=-1)


def _rotate(y: torch.Tensor, positions: torch.Tensor, table: torch.Tensor,
            inverse: bool) -> torch.Tensor:
    """Rotate the last R dims of y [T, ..., D] pairwise by the table rows of `positions`."""
    half = table.shape[1] // 2
    rows = table[positions.long()].float()  # [T, R]
    sin = rows[:, half:]
    return rotate_pairs(y, rows[:, :half], -sin if inverse else sin)


def rms_rotary_ref(x: torch.Tensor, weight: torch.Tensor | None, positions: torch.Tensor,
                   table: torch.Tensor | None, *, eps: float | None,
                   inverse: bool = False) -> torch.Tensor:
    """x [T, D] or [T, H, D] -> the same shape and dtype: with `eps`, each row RMS-normalised
    in fp32 (times `weight` [D] when given) and rounded; then, with `table` ([P, R] from
    `rope_table`), the last R dims rotated at the token's position ([T], < P), by minus the
    angle with `inverse`."""
    y = x
    if eps is not None:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
        y = (normed if weight is None else weight.float() * normed).to(x.dtype)
    return y if table is None else _rotate(y, positions, table, inverse)


def rms_rotary_scatter_ref(x: torch.Tensor, weight: torch.Tensor | None,
                           positions: torch.Tensor, table: torch.Tensor | None,
                           pool: torch.Tensor, slots: torch.Tensor, *,
                           eps: float | None, fp8_rope_dims: int | None = None) -> None:
    """`rms_rotary_ref` of x [T, D], written into rows `slots` ([T]) of pool [S, D] (mutated;
    nothing else is): the raw entries of a step into the paged cache. A negative slot skips
    its token (as `kv_append`). `fp8_rope_dims`: the written rows then rounded as the official
    code stores them (`quant_sim.fp8_round_rows_ref`, the rotary dims kept)."""
    rows = rms_rotary_ref(x, weight, positions, table, eps=eps).to(pool.dtype)
    keep = slots >= 0
    pool[slots[keep].long()] = rows[keep]
    if fp8_rope_dims is not None:
        from openinfer_deepseek_v4.kernels.quant_sim.reference import fp8_round_rows_ref

        fp8_round_rows_ref(pool, slots, fp8_rope_dims)


def q_kv_rms_rotary_ref(q: torch.Tensor, kv: torch.Tensor, kv_weight: torch.Tensor,
                        positions: torch.Tensor, table: torch.Tensor, pool: torch.Tensor,
                        slots: torch.Tensor, *, eps: float,
                        fp8_rope_dims: int | None = None) -> torch.Tensor:
    """A layer's queries and raw entries at once: `rms_rotary_ref(q, None, ...)` (per-head norm
    without weight, then the rotation), returned; and `rms_rotary_scatter_ref(kv, kv_weight,
    ...)` into rows `slots` of pool."""
    rms_rotary_scatter_ref(kv, kv_weight, positions, table, pool, slots, eps=eps,
                           fp8_rope_dims=fp8_rope_dims)
    return rms_rotary_ref(q, None, positions, table, eps=eps)
