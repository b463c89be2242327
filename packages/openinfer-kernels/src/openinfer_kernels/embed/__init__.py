from openinfer_kernels.dispatch import by_device
from openinfer_kernels.embed.reference import embedding_ref

embedding = by_device(embedding_ref)

__all__ = ["embedding", "embedding_ref"]
