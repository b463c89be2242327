from openinfer_kernels.dispatch import by_device
from openinfer_kernels.kv_store.reference import kv_append_ref

kv_append = by_device(kv_append_ref)

__all__ = ["kv_append", "kv_append_ref"]
