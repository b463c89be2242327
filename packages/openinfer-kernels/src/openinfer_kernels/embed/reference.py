"""Token embedding lookup, whole or of one vocabulary part (a tensor-parallel rank's rows)."""

from __future__ import annotations

import torch


def embedding_ref(token_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Rows of `weight` ([V, H]) for `token_ids` ([T]); [T, H] in the weight's dtype."""
    return weight.index_select(0, token_ids)


def embedding_part_ref(token_ids: torch.Tensor, weight: torch.Tensor, start: int) -> torch.Tensor:
    """A vocabulary part's lookup: `weight` ([V_part, H]) holds the rows of ids start ..
    start + V_part - 1; [T, H] in its dtype, the rows of the ids outside the part zeros (the
    sum over the parts is the whole lookup)."""
    local = token_ids - start
    outside = (local < 0) | (local >= weight.shape[0])
    rows = embedding_ref(local.masked_fill(outside, 0), weight)
    return rows.masked_fill_(outside.unsqueeze(-1), 0)
