from openinfer_kernels.dispatch import by_device
from openinfer_kernels.norm.reference import (
    fused_add_rms_norm_ref,
    qk_rms_norm_ref,
    rms_norm_ref,
)

rms_norm = by_device(rms_norm_ref)
fused_add_rms_norm = by_device(fused_add_rms_norm_ref)
qk_rms_norm = by_device(qk_rms_norm_ref)

__all__ = [
    "fused_add_rms_norm",
    "fused_add_rms_norm_ref",
    "qk_rms_norm",
    "qk_rms_norm_ref",
    "rms_norm",
    "rms_norm_ref",
]
