"""DeepSeek-V4's KV compressor: the reference op. No Triton kernel yet."""

from openinfer_kernels.compress.reference import (
    compress_chunk_ref,
    compress_kv_ref,
    compressor_state,
)

__all__ = ["compress_chunk_ref", "compress_kv_ref", "compressor_state"]
