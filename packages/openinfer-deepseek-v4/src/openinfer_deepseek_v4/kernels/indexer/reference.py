"""DeepSeek-V4's lightning indexer (spec: shared deepseek-v4.md §5.6): in the ratio-4 layers
each query picks which compressed entries it attends to. The score of entry j for the query at
token t is sum_h w[t, h] * ReLU(q[t, h] . K[j]) over the indexer's heads; the query keeps the
top k of the entries it may see (entry j summarises tokens [4j, 4j + 3], visible from token
4j + 3 on), fewer where fewer are visible, -1 marking the unused picks."""

from __future__ import annotations

import torch

from openinfer_deepseek_v4.kernels.quant_sim.storage import Fp4Keys, stored_rows


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


def paged_entry_slots(block_tables: torch.Tensor, requests: torch.Tensor,
                      entries: torch.Tensor, *, ratio: int, block_size: int,
                      slots_per_block: int) -> torch.Tensor:
    """Flat rows of a [blocks, slots_per_block, d] entry pool holding entries `entries`
    ([T, n] int, -1 for none) of the requests `requests` ([T] int, rows of block_tables
    [B, max_blocks]): entry j sits in the block of token (j + 1) * ratio - 1 (the model's
    `kv_cache.CompressedCache.entry_slots`). -1 stays -1; int32."""
    last = (entries.long().clamp(min=0) + 1) * ratio - 1
    column = (last // block_size).clamp(max=block_tables.shape[1] - 1)
    blocks = block_tables.long()[requests.long()[:, None], column]
    slots = blocks * slots_per_block + (last % block_size) // ratio
    return torch.where(entries >= 0, slots, -1).to(torch.int32)


def token_requests(query_start_loc: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[T] int32: the request of each token of a step (tokens past the last request's, a CUDA
    graph's padding, count as the last request's)."""
    tokens = torch.arange(num_tokens, device=query_start_loc.device,
                          dtype=query_start_loc.dtype)
    owner = torch.searchsorted(query_start_loc[1:].contiguous(), tokens, right=True)
    return owner.clamp(max=max(query_start_loc.shape[0] - 2, 0)).to(torch.int32)


def indexer_topk_paged_ref(q: torch.Tensor, weights: torch.Tensor, index_pool: torch.Tensor,
                           block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                           positions: torch.Tensor, *, ratio: int, block_size: int,
                           top_k: int, softmax_scale: float, weights_scale: float,
                           as_slots: bool = False, max_entries: int | None = None,
                           requests: torch.Tensor | None = None,
                           key_format: Fp4Keys | None = None) -> torch.Tensor:
    """The indexer over the paged cache: q [T, H, d], weights [T, H]; index_pool
    [blocks, slots_per_block, d] (the indexer compressor's entries); block_tables
    [B, max_blocks] and query_start_loc [B + 1] int32 (the step's requests); positions [T].
    -> picks [T, top_k] int32: the query's `indexer_topk_ordered_ref` picks (best first, ties
    to the earlier entry, -1 padded to top_k), as entry numbers j, or with `as_slots` as rows
    of the flattened pool (and of the main compressor's entry pool: the same layout). A query
    sees at most `max_entries` entries (default: all its position allows). `requests`, each
    token's request (`token_requests`), when the caller has it already. With `key_format`,
    index_pool holds uint8 rows of that format, decoded to q's dtype as they are read."""
    from openinfer_deepseek_v4.kernels.indexer.ordered_topk import indexer_topk_ordered_ref

    num_tokens = q.shape[0]
    if requests is None:
        requests = token_requests(query_start_loc, num_tokens)
    picks = torch.full((num_tokens, top_k), -1, dtype=torch.int32, device=q.device)
    pool = index_pool.flatten(0, 1)
    for t in range(num_tokens):
        visible = (int(positions[t]) + 1) // ratio
        if max_entries is not None:
            visible = min(visible, max_entries)
        if visible == 0:
            continue
        entries = torch.arange(visible, device=q.device)[None]
        slots = paged_entry_slots(block_tables, requests[t:t + 1], entries, ratio=ratio,
                                  block_size=block_size, slots_per_block=index_pool.shape[1])
        keys = stored_rows(pool, slots[0], key_format, q.dtype)
        scores = indexer_scores_ref(q[t:t + 1], keys, weights[t:t + 1],
                                    softmax_scale=softmax_scale, weights_scale=weights_scale)
        row = indexer_topk_ordered_ref(scores, positions[t:t + 1], ratio=ratio, top_k=top_k)
        picks[t, :row.shape[1]] = row[0].to(torch.int32)
    if as_slots:
        return paged_entry_slots(block_tables, requests, picks, ratio=ratio,
                                 block_size=block_size, slots_per_block=index_pool.shape[1])
    return picks
