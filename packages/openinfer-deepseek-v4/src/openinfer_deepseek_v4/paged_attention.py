"""One attention sublayer over a step's tokens on the paged cache (`kv_cache`): the math of
`reference.attention` over a whole sequence, with every request's keys read from its blocks by
slot. The step is batched: no loop over requests and no host sync (the widths are the step's
host-known bounds), with the Triton kernels on the GPU and their references on CPU:

1. project the queries and raw entries; write the raw entries and the compressor projections
   into the step's slots;
2. `compress_pool`: the compressed entries whose windows close in this step;
3. per query, its keys as slots: the window's raw entries, and the compressed entries it sees
   (HCA: all; CSA: `indexer_topk_paged`'s picks);
4. `sparse_sink_attention` over those slots, then the output projection."""

from __future__ import annotations

import torch

from openinfer_core.interfaces.model import ForwardBatch
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.kv_cache import CompressedCache, LayerCache
from openinfer_deepseek_v4.reference import (
    AttentionWeights,
    CompressorWeights,
    attention_output,
    compressor_inputs,
    indexer_inputs,
    project,
    window_positions,
)
from openinfer_kernels.compress import compress_pool
from openinfer_kernels.indexer import indexer_topk_paged, paged_entry_slots, token_requests
from openinfer_kernels.sparse_attention import sparse_sink_attention


def paged_attention(x: torch.Tensor, w: AttentionWeights, cfg: DeepseekV4Config, layer: int,
                    cache: LayerCache, batch: ForwardBatch, freqs: torch.Tensor) -> torch.Tensor:
    """x [T, H] (the step's normed collapsed streams) -> [T, H], `freqs` the layer's rotary
    frequencies on x's device (`reference.layer_freqs`). Mutates the layer's cache: the step's
    raw entries, compressor projections and newly closed compressed entries."""
    kind = cfg.attention_kinds[layer]
    p = project(x, w, cfg, batch.positions, freqs)
    cache.kv.flatten(0, 1)[batch.slot_mapping] = p.kv
    parts: list[tuple[CompressedCache, CompressorWeights, bool]] = []
    if cache.compressor is not None:
        assert w.compressor is not None
        parts.append((cache.compressor, w.compressor, kind == "csa"))
    if cache.indexer is not None:
        assert w.indexer is not None
        parts.append((cache.indexer, w.indexer.compressor, True))
    for part, weights, overlap in parts:
        part.projections.flatten(0, 1)[batch.slot_mapping] = torch.cat(
            compressor_inputs(x, weights), dim=-1)
        compress_pool(part.projections, part.entries, weights.position_bias, weights.norm,
                      freqs, batch.block_tables, batch.seq_lens, batch.query_start_loc,
                      batch.max_query_len, ratio=part.ratio, overlap=overlap,
                      norm_eps=cfg.rms_norm_eps)

    requests = token_requests(batch.query_start_loc, x.shape[0])
    window = window_slots(batch, requests, cfg.sliding_window, cache.kv.shape[1])
    pool = cache.kv.new_zeros((0, cfg.head_dim))
    picked = window.new_zeros((x.shape[0], 0))
    if cache.compressor is not None:
        pool = cache.compressor.entries.flatten(0, 1)
        picked = _picked_slots(x, p.q_residual, batch, requests, w, cfg, cache, freqs)
    out = sparse_sink_attention(p.q, cache.kv.flatten(0, 1), pool, window, picked, w.sinks,
                                cfg.head_dim ** -0.5)
    return attention_output(out, w, cfg, batch.positions, freqs)


def window_slots(batch: ForwardBatch, requests: torch.Tensor, size: int,
                 block_size: int) -> torch.Tensor:
    """[T, size] int32: the raw-entry slots of each query's window (-1 before position 0)."""
    window, real = window_positions(batch.positions, size)
    blocks = batch.block_tables.long()[requests.long()[:, None], window // block_size]
    return torch.where(real, blocks * block_size + window % block_size, -1).to(torch.int32)


def _picked_slots(x: torch.Tensor, q_residual: torch.Tensor, batch: ForwardBatch,
                  requests: torch.Tensor, w: AttentionWeights, cfg: DeepseekV4Config,
                  cache: LayerCache, freqs: torch.Tensor) -> torch.Tensor:
    """[T, K] int32: the compressed-entry slots each query attends to (-1: none). CSA: the
    indexer's top k of the entries it sees; HCA: all it sees. K is bounded by the step's
    longest request (`max_seq_len`), so no width depends on device values."""
    part = cache.compressor
    assert part is not None
    block_size, ratio = part.projections.shape[1], part.ratio
    most = batch.max_seq_len // ratio
    if cache.indexer is not None:
        q, weights = indexer_inputs(x, q_residual, batch.positions, w, cfg, freqs)
        return indexer_topk_paged(q, weights, cache.indexer.entries, batch.block_tables,
                                  batch.query_start_loc, batch.positions, ratio=ratio,
                                  block_size=block_size, top_k=cfg.index_topk,
                                  softmax_scale=cfg.index_head_dim ** -0.5,
                                  weights_scale=cfg.index_n_heads ** -0.5, as_slots=True,
                                  max_entries=most)
    entries = torch.arange(most, device=x.device).expand(x.shape[0], -1)
    entries = torch.where(entries < ((batch.positions + 1) // ratio)[:, None], entries, -1)
    return paged_entry_slots(batch.block_tables, requests, entries, ratio=ratio,
                             block_size=block_size, slots_per_block=part.entries.shape[1])
