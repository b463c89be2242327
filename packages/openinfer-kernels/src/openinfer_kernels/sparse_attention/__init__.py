"""Attention over a gathered key set with per-head sinks (DeepSeek-V4): the reference op. No
Triton kernel yet."""

from openinfer_kernels.sparse_attention.reference import sink_attention_ref

__all__ = ["sink_attention_ref"]
