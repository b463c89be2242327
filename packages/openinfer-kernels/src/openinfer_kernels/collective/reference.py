"""The all-reduce + residual add + RMSNorm of a row-split layer under tensor parallelism, as one
process sees it: every rank's partial product at once, in rank order."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from openinfer_kernels.norm.reference import fused_add_rms_norm_ref


def all_reduce_add_rms_norm_ref(partials: Sequence[torch.Tensor], residual: torch.Tensor,
                                weight: torch.Tensor,
                                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(s + residual) * weight, s + residual), what every rank gets: `s` the ranks'
    `partials` summed in fp32 in rank order and rounded once to their dtype, as the all-reduce
    would hand it over; then `fused_add_rms_norm_ref` (the add in fp32, rounded as the new
    residual, and the norm of that rounded stream)."""
    total = partials[0].float()
    for partial in partials[1:]:
        total = total + partial.float()
    return fused_add_rms_norm_ref(total.to(partials[0].dtype), residual, weight, eps)
