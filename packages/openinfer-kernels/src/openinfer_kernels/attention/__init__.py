from openinfer_kernels.attention.reference import paged_attention_ref
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_kernels.attention.triton")

paged_attention = by_device(paged_attention_ref,
                            _kernels.paged_attention_triton if _kernels else None)

__all__ = ["paged_attention", "paged_attention_ref"]
