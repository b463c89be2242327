"""Qwen3's per-head q/k RMSNorm followed by rotary embedding, as one op (the kernel fuses them)."""

from __future__ import annotations

import torch

from openinfer_kernels.kv_store.reference import kv_append_ref
from openinfer_kernels.norm.reference import qk_rms_norm_ref
from openinfer_kernels.rotary.reference import rotary_embedding_ref


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
                            slot_mapping: torch.Tensor) -> torch.Tensor:
    """`qk_norm_rope_ref`, then `kv_append_ref` of the rotated k and of v ([T, Hk, D]) into the
    caches at `slot_mapping`: this step's K/V are in the cache, and the rotated q is returned.
    Mutates the caches."""
    q, k = qk_norm_rope_ref(q, k, q_weight, k_weight, eps, positions, cos_sin)
    kv_append_ref(k, v, k_cache, v_cache, slot_mapping)
    return q
