"""Rotary position embedding, GPT-NeoX halves (Qwen3's): `rotary_embedding` alone runs its
reference on every device; on CUDA the Triton kernel is the fused `qk_norm_rope` (per-head
q/k RMSNorm, then rotary) and `qk_norm_rope_append` (the same, then the rotated k and v into
the paged cache)."""

from openinfer_kernels.dispatch import by_device, triton_kernels
from openinfer_kernels.rotary.reference import (
    qk_norm_rope_append_ref,
    qk_norm_rope_ref,
    rope_cos_sin,
    rotary_embedding_ref,
)

_kernels = triton_kernels("openinfer_kernels.rotary.triton")

rotary_embedding = by_device(rotary_embedding_ref)
qk_norm_rope = by_device(qk_norm_rope_ref, _kernels.qk_norm_rope_triton if _kernels else None)
qk_norm_rope_append = by_device(qk_norm_rope_append_ref,
                                _kernels.qk_norm_rope_append_triton if _kernels else None)

__all__ = ["qk_norm_rope", "qk_norm_rope_append", "qk_norm_rope_append_ref", "qk_norm_rope_ref",
           "rope_cos_sin", "rotary_embedding", "rotary_embedding_ref"]
