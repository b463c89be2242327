"""Attention of each query over its own set of keys, with a per-head sink (spec: shared
deepseek-v4.md §5.3). DeepSeek-V4 has one KV head whose entries are both key and value; a
query's set is its sliding window of raw entries beside the compressed entries it selected.
The sink is a learned logit per head with a zero value: it takes a share of the softmax and
gives nothing, so a head can attend to nothing."""

from __future__ import annotations

import torch

from openinfer_deepseek_v4.kernels.quant_sim.storage import Fp8Entries, stored_rows
from openinfer_deepseek_v4.kernels.rotary.reference import rms_rotary_ref


def sink_attention_ref(q: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor,
                       sinks: torch.Tensor, scale: float) -> torch.Tensor:
    """q [T, H, D]; kv [T, K, D], query t's K entries (keys and values); valid [T, K] bool;
    sinks [H] -> [T, H, D] in q's dtype. Scores and softmax in fp32, the probabilities rounded
    to kv's dtype before they weight the values."""
    scores = torch.einsum("thd,tkd->thk", q.float(), kv.float()) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    logits = torch.cat([scores, sinks.float()[None, :, None].expand(q.shape[0], -1, 1)], dim=-1)
    probs = torch.softmax(logits - logits.amax(dim=-1, keepdim=True), dim=-1)[..., :-1]
    return torch.einsum("thk,tkd->thd", probs.to(kv.dtype), kv).to(q.dtype)


def sparse_sink_attention_ref(q: torch.Tensor, kv_pool: torch.Tensor, entry_pool: torch.Tensor,
                              window_slots: torch.Tensor, picked_slots: torch.Tensor,
                              sinks: torch.Tensor, scale: float, *,
                              entry_format: Fp8Entries | None = None,
                              positions: torch.Tensor | None = None,
                              rope_table: torch.Tensor | None = None) -> torch.Tensor:
    """`sink_attention_ref` with each query's entries read from two pools of rows: q [T, H, D];
    kv_pool [S1, D] (raw entries) and entry_pool [S2, D] (compressed entries), one dtype;
    window_slots [T, W] and picked_slots [T, K] int, rows of kv_pool and entry_pool, -1 where
    there is none; sinks [H] fp32 -> [T, H, D] in q's dtype. A query with no entry at all
    gives 0: only its sink is left, and the sink carries no value. With `entry_format`,
    entry_pool holds uint8 rows of that format, decoded to kv_pool's dtype as they are read.
    With `rope_table` ([max_positions, R], `kernels.rotary.rope_table`), the output's last R
    dims of each head are rotated back at `positions` [T] (`rms_rotary_ref`'s inverse without
    a norm): DeepSeek-V4's values carry their keys' rotation, which the output undoes."""
    picked = stored_rows(entry_pool, picked_slots.clamp(min=0), entry_format, kv_pool.dtype)
    entries = torch.cat([kv_pool[window_slots.clamp(min=0).long()], picked], dim=1)
    valid = torch.cat([window_slots >= 0, picked_slots >= 0], dim=1)
    out = sink_attention_ref(q, entries, valid, sinks, scale)
    if rope_table is None:
        return out
    assert positions is not None, "a rope table needs the queries' positions"
    return rms_rotary_ref(out, None, positions, rope_table, eps=None, inverse=True)
