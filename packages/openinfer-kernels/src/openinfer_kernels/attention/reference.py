"""Paged attention for a mixed batch: prefill chunks attending to their cached prefix and
single-token decodes, one request at a time, fp32 math."""

from __future__ import annotations

import torch

from openinfer_kernels.kv_store.reference import dequantize_kv


def _gather_context(cache: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one request's cache, [length, Hk, D]."""
    block_size = cache.shape[1]
    used = blocks[: (length + block_size - 1) // block_size]
    return cache.index_select(0, used).flatten(0, 1)[:length]


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor,
                        query_start_loc: torch.Tensor, scale: float, *,
                        k_scale: torch.Tensor | None = None,
                        v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of q ([T, Hq, D]) over paged K/V ([num_blocks, block_size, Hk, D]).

    Request b's queries are rows query_start_loc[b]:query_start_loc[b+1]; they are its last
    tokens, so with n queries and context L, query i sits at position L - n + i and sees keys
    0..L - n + i. The cache must already hold this step's keys. Hq must be a multiple of Hk
    (grouped-query attention: query head h reads kv head h // (Hq / Hk)). e4m3 caches hold
    KV head h's keys / k_scale[h] and values / v_scale[h] (fp32 [Hk], 1.0 where None;
    `kv_store.quantize_kv`): they are read back times their scales; other caches ignore the
    scales."""
    out = torch.empty_like(q)
    group = q.shape[1] // k_cache.shape[2]
    starts = query_start_loc.tolist()
    for b, length in enumerate(seq_lens.tolist()):
        lo, hi = starts[b], starts[b + 1]
        n = hi - lo
        if n == 0:
            continue
        keys = dequantize_kv(_gather_context(k_cache, block_tables[b], length),
                             1.0 if k_scale is None else k_scale)
        values = dequantize_kv(_gather_context(v_cache, block_tables[b], length),
                               1.0 if v_scale is None else v_scale)
        keys = keys.repeat_interleave(group, dim=1)  # [L, Hq, D]
        values = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[lo:hi].float(), keys) * scale
        q_pos = torch.arange(length - n, length, device=q.device)[:, None]
        k_pos = torch.arange(length, device=q.device)[None, :]
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[lo:hi] = torch.einsum("hqk,khd->qhd", probs, values).to(q.dtype)
    return out
