"""DeepSeek-V4's rotary: `rope_frequencies` (plain or YaRN), `rotary_interleaved_ref` (the
last R dims of a head rotated as consecutive pairs, or back), and `rms_rotary`, the optional
RMSNorm plus that rotation over a step's rows (q, kv, indexer q, the attention output's inverse
rotation) with cos and sin from a per-position table made once (`rope_table`), and
`rms_rotary_scatter`, the same into cache rows, and `q_kv_rms_rotary`, a layer's queries and
raw entries in one launch: a Triton kernel on CUDA tensors, the references on CPU."""

from openinfer_deepseek_v4.kernels.rotary.reference import (
    q_kv_rms_rotary_ref,
    rms_rotary_ref,
    rms_rotary_scatter_ref,
    rope_frequencies,
    rope_table,
    rotary_interleaved_ref,
)
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_deepseek_v4.kernels.rotary.triton")

rms_rotary = by_device(rms_rotary_ref, _kernels.rms_rotary_triton if _kernels else None)
rms_rotary_scatter = by_device(rms_rotary_scatter_ref,
                               _kernels.rms_rotary_scatter_triton if _kernels else None)
q_kv_rms_rotary = by_device(q_kv_rms_rotary_ref,
                            _kernels.q_kv_rms_rotary_triton if _kernels else None)

__all__ = ["q_kv_rms_rotary", "q_kv_rms_rotary_ref", "rms_rotary", "rms_rotary_ref",
           "rms_rotary_scatter", "rms_rotary_scatter_ref",
           "rope_frequencies", "rope_table", "rotary_interleaved_ref"]
