"""DeepSeek-V4's KV compressor: the reference op. No Triton kernel yet."""

from openinfer_kernels.compress.reference import compress_kv_ref

__all__ = ["compress_kv_ref"]
