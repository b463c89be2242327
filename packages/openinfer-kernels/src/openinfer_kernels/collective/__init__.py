"""Collectives fused with the kernels around them, over torch's symmetric memory.

`all_reduce_add_rms_norm`: this rank's share of a row-split layer's all-reduce, the residual add
and the RMSNorm after it, in one kernel (triton.py); `all_reduce_add_rms_norm_push`: the same
for a decode step's few rows, pushed into the peers' memory (push_triton.py; how a pushed row
signals that it landed, by `OPENINFER_TP_PUSH_SIGNAL`, read here; its `all_reduce`: the sum
alone, over the same memory, where the rows are their own signal); `linear_push_add_rms_norm`:
the row-split linear before it in the same launch, its output pushed by itself
(linear_push_triton.py); `push_ids`: rank 0's token ids pushed onto every rank at a step's
start (push_ids.py); None where triton is not installed. Their reference takes every rank's
partial product at once (reference.py)."""

from openinfer_kernels.collective.reference import all_reduce_add_rms_norm_ref
from openinfer_kernels.dispatch import triton_kernels

_kernels = triton_kernels("openinfer_kernels.collective.triton")
_push = triton_kernels("openinfer_kernels.collective.push_triton")
_linear_push = triton_kernels("openinfer_kernels.collective.linear_push_triton")
_push_ids = triton_kernels("openinfer_kernels.collective.push_ids")

all_reduce_add_rms_norm = _kernels.all_reduce_add_rms_norm_triton if _kernels else None
all_reduce_add_rms_norm_push = _push.PushAddNorm(_push.push_signal()) if _push else None
linear_push_add_rms_norm = _linear_push.LinearPushAddNorm() if _linear_push else None
push_ids = _push_ids.PushIds() if _push_ids else None

__all__ = ["all_reduce_add_rms_norm", "all_reduce_add_rms_norm_push",
           "all_reduce_add_rms_norm_ref", "linear_push_add_rms_norm", "push_ids"]
