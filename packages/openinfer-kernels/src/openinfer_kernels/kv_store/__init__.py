from openinfer_kernels.dispatch import by_device, triton_kernels
from openinfer_kernels.kv_store.reference import (
    FP8_KV_DTYPE,
    FP8_MAX,
    dequantize_kv,
    kv_append_ref,
    quantize_kv,
)

_kernels = triton_kernels("openinfer_kernels.kv_store.triton")

kv_append = by_device(kv_append_ref, _kernels.kv_append_triton if _kernels else None)

__all__ = ["FP8_KV_DTYPE", "FP8_MAX", "dequantize_kv", "kv_append", "kv_append_ref",
           "quantize_kv"]
