"""`paged_attention_triton`, what `openinfer_kernels.attention` dispatches to on CUDA: each
batch goes to one of two kernels, the split kernel (`split.py`) for short queries and small
steps, the prefill kernel (`prefill.py`) for long prefill chunks."""

from __future__ import annotations

import torch

from openinfer_kernels.attention.prefill import paged_prefill
from openinfer_kernels.attention.split import paged_split

# Batches whose requests have at most this many queries run `paged_split`; longer prefill
# chunks have parallelism enough in their queries and run `paged_prefill`...
SPLIT_MAX_QUERIES = 512
# ...unless the whole step has at most this many tokens: such a step runs `paged_split`
# whatever its spread, so its launches depend on the token count only and it can replay from a
# CUDA graph (a burst of new prompts beside hundreds of decodes is such a step). The split
# kernel holds all heads of a KV group per program, as good as the prefill kernel's tiles here.
SPLIT_MAX_TOKENS = 2048


def paged_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           query_start_loc: torch.Tensor, scale: float, *,
                           max_query_len: int | None = None,
                           max_seq_len: int | None = None,
                           k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """`paged_attention_ref`'s contract (e4m3 caches with their per-head scales included).
    `max_query_len` is the longest request's query count (`ForwardBatch.max_query_len`); left
    out, it is read back from `query_start_loc`, a host sync that a CUDA graph cannot hold.
    `max_seq_len` is accepted for symmetry with the batch and not needed: the kernels read
    each context length on the device."""
    del max_seq_len
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max()) \
            if seq_lens.numel() else 0
    if max_query_len <= SPLIT_MAX_QUERIES or q.shape[0] <= SPLIT_MAX_TOKENS:
        return paged_split(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                           max_query_len, k_scale=k_scale, v_scale=v_scale)
    return paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                         max_query_len, k_scale=k_scale, v_scale=v_scale)
