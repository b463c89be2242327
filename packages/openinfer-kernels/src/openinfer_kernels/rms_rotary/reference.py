"""DeepSeek-V4's per-token RMSNorm and interleaved rotary as one op (spec: shared
deepseek-v4.md §5.1, §5.3, §13): the attention's low-rank query norm, the per-head weightless
query norm, the raw entry's norm, each followed (or not) by the rotation of the last R dims as
pairs (x[2i], x[2i+1]); the indexer's query and the attention output (by minus the angle) are
rotated without a norm.

It computes exactly what the model's reference does piece by piece (`rms_norm` in fp32 times
the fp32 weight, rounded once; then `rotary_interleaved_ref` in fp32 with cos and sin rounded
to the activations' dtype), except that cos and sin come from a table of every position made
once (`rope_table`) rather than from the angles each step."""

from __future__ import annotations

import torch

from openinfer_kernels.rotary.interleaved import rotate_pairs


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
                           eps: float | None) -> None:
    """`rms_rotary_ref` of x [T, D], written into rows `slots` ([T]) of pool [S, D] (mutated;
    nothing else is): the raw entries of a step into the paged cache. A negative slot skips
    its token (as `kv_append`)."""
    rows = rms_rotary_ref(x, weight, positions, table, eps=eps).to(pool.dtype)
    keep = slots >= 0
    pool[slots[keep].long()] = rows[keep]
