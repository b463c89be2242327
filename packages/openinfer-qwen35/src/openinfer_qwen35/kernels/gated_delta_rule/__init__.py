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


def gated_delta_rule_varlen(q: torch.Tensor, *args: Any, plan: Any = None,
                            **kwargs: Any) -> torch.Tensor:
    """`gated_delta_rule_varlen_ref`'s contract; fla's kernels on CUDA. `plan`: a prefill
    step's `fla.ChunkPlan` (CUDA only; built once per step by `chunk_plan`)."""
    if q.is_cuda:
        from openinfer_qwen35.kernels.gated_delta_rule.fla import gated_delta_rule_varlen_fla

        return gated_delta_rule_varlen_fla(q, *args, plan=plan, **kwargs)
    return gated_delta_rule_varlen_ref(q, *args, **kwargs)


def chunk_plan(query_start_loc: torch.Tensor, query_start_loc_cpu: torch.Tensor | None,
               decode: bool) -> Any:
    """A prefill step's `fla.ChunkPlan` on CUDA (shared by every linear layer of the step);
    None for decode steps and on the CPU."""
    if decode or not query_start_loc.is_cuda:
        return None
    from openinfer_qwen35.kernels.gated_delta_rule.fla import ChunkPlan

    return ChunkPlan.of(query_start_loc, query_start_loc_cpu)


__all__ = [
    "chunk_plan",
    "gated_delta_rule_chunk_ref",
    "gated_delta_rule_recurrent_ref",
    "gated_delta_rule_varlen",
    "gated_delta_rule_varlen_ref",
    "l2norm",
]
