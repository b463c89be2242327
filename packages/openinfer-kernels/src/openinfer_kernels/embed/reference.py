"""Token embedding lookup."""

from __future__ import annotations

import torch


def embedding_ref(token_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Rows of `weight` ([V, H]) for `token_ids` ([T]); [T, H] in the weight's dtype."""
    return weight.index_select(0, token_ids)
