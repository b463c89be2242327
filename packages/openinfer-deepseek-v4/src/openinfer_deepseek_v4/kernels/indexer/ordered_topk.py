"""The lightning indexer's top-k with its ties settled: equal scores go to the earlier entry.
`torch.topk` leaves ties to the implementation, and its choice can change with the number of
columns, so a query could pick differently when its scores come in a wider matrix (a whole
prompt) than a narrower one (a decode step, a prefill chunk). Ties are common: an entry that
every head's ReLU zeroes scores exactly 0. With this order a query's picks depend only on the
scores of the entries it may see."""

from __future__ import annotations

import torch


def indexer_topk_ordered_ref(scores: torch.Tensor, positions: torch.Tensor, *, ratio: int,
                             top_k: int) -> torch.Tensor:
    """`indexer_topk_ref` (scores [T, E], positions [T] -> picks [T, min(top_k, E)], -1 where
    a query sees fewer), best first, equal scores in entry order."""
    visible = (positions + 1) // ratio  # entries 0..visible-1
    entries = torch.arange(scores.shape[1], device=scores.device)
    hidden = entries[None, :] >= visible[:, None]
    order = scores.float().masked_fill(hidden, float("-inf")).sort(
        dim=-1, descending=True, stable=True).indices[:, :min(top_k, scores.shape[1])]
    return torch.where(order >= visible[:, None], torch.full_like(order, -1), order)
