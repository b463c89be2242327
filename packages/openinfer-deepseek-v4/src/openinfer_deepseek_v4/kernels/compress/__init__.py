"""DeepSeek-V4's KV compressor. `compress_pool` pools a step's closing windows on the paged
cache: a Triton kernel on CUDA tensors, `compress_pool_ref` on CPU. The whole-sequence and
chunked references (`compress_kv_ref`, `compress_chunk_ref`) are the model reference's."""

from openinfer_deepseek_v4.kernels.compress.reference import (
    compress_chunk_ref,
    compress_kv_ref,
    compress_pool_ref,
    compressor_state,
)
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_deepseek_v4.kernels.compress.triton")

compress_pool = by_device(compress_pool_ref,
                          _kernels.compress_pool_triton if _kernels else None)

__all__ = ["compress_chunk_ref", "compress_kv_ref", "compress_pool", "compress_pool_ref",
           "compressor_state"]
