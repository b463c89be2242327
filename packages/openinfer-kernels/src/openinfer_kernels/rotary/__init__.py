from openinfer_kernels.dispatch import by_device
from openinfer_kernels.rotary.interleaved import rope_frequencies, rotary_interleaved_ref
from openinfer_kernels.rotary.reference import rope_cos_sin, rotary_embedding_ref

rotary_embedding = by_device(rotary_embedding_ref)

__all__ = ["rope_cos_sin", "rope_frequencies", "rotary_embedding", "rotary_embedding_ref",
           "rotary_interleaved_ref"]
