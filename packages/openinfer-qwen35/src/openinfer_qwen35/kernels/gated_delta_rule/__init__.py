"""The gated delta rule: `reference.py` (plain torch, fp32: the recurrence, the chunked form,
and `gated_delta_rule_varlen_ref` over a flattened batch with state slots) and `fla.py` (the
same over flash-linear-attention's kernels, on CUDA). `gated_delta_rule_varlen` picks by the
device of its input."""

from __future__ import annotations

from typing import Any

import torch

from openinfer_qwen35.kernels.gated_delta_rule.reference import (
    gated_delta_rule_chunk_ref,
    gated_delta_rule_recurrent_ref,
    gated_delta_rule_varlen_ref,
    l2norm,
)


def gated_delta_rule_varlen(q: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """`gated_delta_rule_varlen_ref`'s contract; fla's kernels on CUDA."""
    if q.is_cuda:
        from openinfer_qwen35.kernels.gated_delta_rule.fla import gated_delta_rule_varlen_fla

        return gated_delta_rule_varlen_fla(q, *args, **kwargs)
    return gated_delta_rule_varlen_ref(q, *args, **kwargs)


__all__ = [
    "gated_delta_rule_chunk_ref",
    "gated_delta_rule_recurrent_ref",
    "gated_delta_rule_varlen",
    "gated_delta_rule_varlen_ref",
    "l2norm",
]
