from openinfer_kernels.dispatch import by_device, triton_kernels
from openinfer_kernels.norm_rope.reference import qk_norm_rope_append_ref, qk_norm_rope_ref

_kernels = triton_kernels("openinfer_kernels.norm_rope.triton")

qk_norm_rope = by_device(qk_norm_rope_ref, _kernels.qk_norm_rope_triton if _kernels else None)
qk_norm_rope_append = by_device(qk_norm_rope_append_ref,
                                _kernels.qk_norm_rope_append_triton if _kernels else None)

__all__ = ["qk_norm_rope", "qk_norm_rope_append", "qk_norm_rope_append_ref", "qk_norm_rope_ref"]
