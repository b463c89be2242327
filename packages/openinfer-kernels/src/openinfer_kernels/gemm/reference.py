"""A linear layer without bias, `y = x @ w.T`, with fp32 accumulation rounded once to x's
dtype: the spec the small-batch kernels are tested against."""

from __future__ import annotations

import torch


def linear_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x: [M, K], w: [N, K] (a HuggingFace Linear weight) -> [M, N] in x's dtype."""
    return (x.float() @ w.float().t()).to(x.dtype)
