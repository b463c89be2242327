"""DeepSeek-V4's lightning indexer (spec: shared deepseek-v4.md §5.6): in the ratio-4 layers
each query picks which compressed entries it attends to. The score of entry j for the query at
token t is sum_h w[t, h] * ReLU(q[t, h] . K[j]) over the indexer's heads; the query keeps the
top k of the entries it may see (entry j summarises tokens [4j, 4j + 3], visible from token
4j + 3 on), fewer where fewer are visible, -1 marking the unused picks."""

from __future__ import annotations

import torch


def indexer_scores_ref(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, *,
                       softmax_scale: float, weights_scale: float) -> torch.Tensor:
    """q [T, H, d] (rotated), keys [E, d] (the indexer compressor's entries), weights [T, H]
    (x W_w^T) -> scores [T, E] fp32."""
    dots = torch.relu(torch.einsum("thd,ed->the", q.float(), keys.float())) * softmax_scale
    return (dots * (weights.float() * weights_scale).unsqueeze(-1)).sum(dim=1)


def indexer_topk_ref(scores: torch.Tensor, positions: torch.Tensor, *, ratio: int,
                     top_k: int) -> torch.Tensor:
    """scores [T, E], positions [T] -> picks [T, min(top_k, E)] int64: the highest-scoring
    entries each query may see, best first; -1 where it sees fewer."""
    visible = (positions + 1) // ratio  # entries 0..visible-1
    entries = torch.arange(scores.shape[1], device=scores.device)
    hidden = entries[None, :] >= visible[:, None]
    picks = scores.masked_fill(hidden, float("-inf")).topk(min(top_k, scores.shape[1]),
                                                           dim=-1).indices
    return torch.where(picks >= visible[:, None], torch.full_like(picks, -1), picks)
