"""Attention over a gathered key set with per-head sinks (DeepSeek-V4). `sparse_sink_attention`
reads each query's entries from the paged pools by slot: the Triton kernel on CUDA tensors,
the reference on CPU."""

from openinfer_deepseek_v4.kernels.sparse_attention.reference import (
    sink_attention_ref,
    sparse_sink_attention_ref,
)
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_deepseek_v4.kernels.sparse_attention.triton")

sparse_sink_attention = by_device(
    sparse_sink_attention_ref,
    None if _kernels is None else _kernels.sparse_sink_attention_triton)

__all__ = ["sink_attention_ref", "sparse_sink_attention", "sparse_sink_attention_ref"]
