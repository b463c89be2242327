"""Tensor parallelism over torch.distributed (NCCL on CUDA, gloo on CPU): the rank-0 model the
engine holds (`TensorParallelModel`), the process group a model line's shards talk through
(`TorchTensorParallelGroup`), and how a model is cut (`sharding`)."""

from __future__ import annotations

from openinfer_core.distributed.group import TorchTensorParallelGroup
from openinfer_core.distributed.sharding import (
    HeadShard,
    VocabShard,
    attention_heads,
    split_range,
    vocab_shard,
)
from openinfer_core.distributed.tp_model import TensorParallelModel

__all__ = ["HeadShard", "TensorParallelModel", "TorchTensorParallelGroup", "VocabShard",
           "attention_heads", "split_range", "vocab_shard"]
