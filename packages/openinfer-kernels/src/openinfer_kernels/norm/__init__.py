from openinfer_kernels.dispatch import by_device, triton_kernels
from openinfer_kernels.norm.reference import (
    fused_add_rms_norm_ref,
    qk_rms_norm_ref,
    rms_norm_ref,
)

_kernels = triton_kernels("openinfer_kernels.norm.triton")

rms_norm = by_device(rms_norm_ref, _kernels.rms_norm_triton if _kernels else None)
fused_add_rms_norm = by_device(fused_add_rms_norm_ref,
                               _kernels.fused_add_rms_norm_triton if _kernels else None)
qk_rms_norm = by_device(qk_rms_norm_ref, _kernels.qk_rms_norm_triton if _kernels else None)

__all__ = [
    "fused_add_rms_norm",
    "fused_add_rms_norm_ref",
    "qk_rms_norm",
    "qk_rms_norm_ref",
    "rms_norm",
    "rms_norm_ref",
]
