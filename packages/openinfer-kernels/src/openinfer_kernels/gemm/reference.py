"""A linear layer without bias, `y = x @ w.T`, with fp32 accumulation rounded once to x's
dtype: the spec the small-batch kernels are tested against."""

from __future__ import annotations

import torch


def linear_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x: [M, K], w: [N, K] (a HuggingFace Linear weight) -> [M, N] in x's dtype."""
    return (x.float() @ w.float().t()).to(x.dtype)


def grouped_linear_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A block-diagonal linear: x [T, G, K], w [G * R, K] (group g's rows g*R..) ->
    [T, G, R], each group projected by its own rows, in x's dtype (DeepSeek-V4's grouped
    output projection, spec §5.4)."""
    groups = x.shape[1]
    w = w.view(groups, -1, x.shape[-1]).float()
    return torch.einsum("tgk,grk->tgr", x.float(), w).to(x.dtype)
