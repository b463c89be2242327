"""Rotary position embedding in Qwen3's (GPT-NeoX) convention: the head dimension is split into
two halves, and pair (i, i + D/2) is rotated by angle position * theta^(-2i/D). Alone
(`rotary_embedding_ref`), and after the per-head q/k RMSNorm, optionally followed by the KV
append of the rotated k and of v (`qk_norm_rope_ref`, `qk_norm_rope_append_ref`: the Triton
kernel fuses them, and is rotary's GPU path)."""

from __future__ import annotations

import torch

from openinfer_kernels.kv_store.reference import kv_append_ref
from openinfer_kernels.norm.reference import qk_rms_norm_ref


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


def qk_norm_rope_ref(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                     k_weight: torch.Tensor, eps: float, positions: torch.Tensor,
                     cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rotary_embedding(qk_rms_norm(q, k, ...), positions, cos_sin): q ([T, Hq, D]) and k
    ([T, Hk, D]) normed per head over D, then rotated by their tokens' `positions` ([T]) with
    `cos_sin` ([max_pos, D] fp32, GPT-NeoX halves). The normed values are rounded to the input
    dtype between the two steps, as the unfused model does."""
    return rotary_embedding_ref(*qk_rms_norm_ref(q, k, q_weight, k_weight, eps), positions,
                                cos_sin)


def qk_norm_rope_append_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                            positions: torch.Tensor, cos_sin: torch.Tensor,
                            k_cache: torch.Tensor, v_cache: torch.Tensor,
                            slot_mapping: torch.Tensor, *, k_scale: torch.Tensor | None = None,
                            v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """`qk_norm_rope_ref`, then `kv_append_ref` of the rotated k and of v ([T, Hk, D]) into the
    caches at `slot_mapping` (e4m3 caches quantized with the per-head `k_scale`, `v_scale`):
    this step's K/V are in the cache, and the rotated q is returned. Mutates the caches."""
    q, k = qk_norm_rope_ref(q, k, q_weight, k_weight, eps, positions, cos_sin)
    kv_append_ref(k, v, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)
    return q
