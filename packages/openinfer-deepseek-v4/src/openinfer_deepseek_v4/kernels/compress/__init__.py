"""DeepSeek-V4's KV compressor on the paged cache: `store_projections` writes a step's per-token
projections into their cache rows, `compress_pool` pools the step's closing windows, and
`store_and_pool` does both (one launch at a decode step); Triton kernels on CUDA tensors, the
references (`store_projections_ref`, `compress_pool_ref`, `store_and_pool_ref`) on CPU.
The whole-sequence and chunked references (`compress_kv_ref`, `compress_chunk_ref`) are the
model reference's."""

from openinfer_deepseek_v4.kernels.compress.reference import (
    compress_chunk_ref,
    compress_kv_ref,
    compress_pool_ref,
    compressor_state,
    store_and_pool_ref,
    store_projections_ref,
)
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_deepseek_v4.kernels.compress.triton")

compress_pool = by_device(compress_pool_ref,
                          _kernels.compress_pool_triton if _kernels else None)

store_projections = by_device(store_projections_ref,
                              _kernels.store_projections_triton if _kernels else None)

store_and_pool = by_device(store_and_pool_ref,
                           _kernels.store_and_pool_triton if _kernels else None)

__all__ = ["compress_chunk_ref", "compress_kv_ref", "compress_pool", "compress_pool_ref",
           "compressor_state", "store_and_pool", "store_and_pool_ref", "store_projections",
           "store_projections_ref"]
