"""DeepSeek-V4's RMSNorm + interleaved rotary over a step's rows (q, kv, indexer q, the
attention output's inverse rotation), with cos and sin from a per-position table made once:
a Triton kernel on CUDA tensors, the references on CPU."""

from openinfer_kernels.dispatch import by_device, triton_kernels
from openinfer_kernels.rms_rotary.reference import (
    rms_rotary_ref,
    rms_rotary_scatter_ref,
    rope_table,
)

_kernels = triton_kernels("openinfer_kernels.rms_rotary.triton")

rms_rotary = by_device(rms_rotary_ref, _kernels.rms_rotary_triton if _kernels else None)
rms_rotary_scatter = by_device(rms_rotary_scatter_ref,
                               _kernels.rms_rotary_scatter_triton if _kernels else None)

__all__ = ["rms_rotary", "rms_rotary_ref", "rms_rotary_scatter", "rms_rotary_scatter_ref",
           "rope_table"]
