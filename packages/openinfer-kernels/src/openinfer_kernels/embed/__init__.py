from openinfer_kernels.dispatch import by_device, triton_kernels
from openinfer_kernels.embed.reference import embedding_part_ref, embedding_ref

_kernels = triton_kernels("openinfer_kernels.embed.triton")

embedding = by_device(embedding_ref)
embedding_part = by_device(embedding_part_ref,
                           _kernels.embedding_part_triton if _kernels else None)

__all__ = ["embedding", "embedding_part", "embedding_part_ref", "embedding_ref"]
