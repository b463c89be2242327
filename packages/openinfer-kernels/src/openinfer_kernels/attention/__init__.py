from openinfer_kernels.attention.reference import paged_attention_ref
from openinfer_kernels.dispatch import by_device

paged_attention = by_device(paged_attention_ref)

__all__ = ["paged_attention", "paged_attention_ref"]
