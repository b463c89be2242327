"""One attention sublayer over a step's tokens on the paged cache (`kv_cache`): the same math
as `reference.attention` over a whole sequence, with each request's keys read from its blocks.
Plain torch with a loop over the requests: the CPU path, and the oracle of later kernels."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openinfer_core.interfaces.model import ForwardBatch
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.kv_cache import CompressedCache, LayerCache, token_slots
from openinfer_deepseek_v4.reference import (
    AttentionWeights,
    CompressorWeights,
    attend,
    compressed_picks,
    compressor_inputs,
    layer_freqs,
    project,
    window_positions,
)
from openinfer_kernels.compress import compress_pool


@dataclass(frozen=True, slots=True)
class StepRequest:
    """One request's part of a step."""

    rows: slice  # its tokens among the step's
    first: int  # the position of the first of them
    last: int  # the position of the last (its context length - 1)
    table: torch.Tensor  # its block table, on the device


def step_requests(batch: ForwardBatch) -> list[StepRequest]:
    starts = (batch.query_start_loc_cpu if batch.query_start_loc_cpu is not None
              else batch.query_start_loc.cpu()).tolist()
    lens = (batch.seq_lens_cpu if batch.seq_lens_cpu is not None
            else batch.seq_lens.cpu()).tolist()
    return [StepRequest(slice(starts[b], starts[b + 1]), lens[b] - (starts[b + 1] - starts[b]),
                        lens[b] - 1, batch.block_tables[b])
            for b in range(len(lens))]


def paged_attention(x: torch.Tensor, w: AttentionWeights, cfg: DeepseekV4Config, layer: int,
                    cache: LayerCache, batch: ForwardBatch,
                    requests: list[StepRequest]) -> torch.Tensor:
    """x [T, H] (the step's normed collapsed streams) -> [T, H]. Writes the step's raw entries
    and compressor projections into their slots, pools the compressed entries whose windows
    close in this step, then attends each query over its keys read from the cache."""
    kind = cfg.attention_kinds[layer]
    freqs = layer_freqs(cfg, layer)
    p = project(x, w, cfg, batch.positions, freqs)
    cache.kv.flatten(0, 1)[batch.slot_mapping] = p.kv
    parts: list[tuple[CompressedCache, CompressorWeights, bool]] = []
    if cache.compressor is not None:
        assert w.compressor is not None
        parts.append((cache.compressor, w.compressor, kind == "csa"))
    if cache.indexer is not None:
        assert w.indexer is not None
        parts.append((cache.indexer, w.indexer.compressor, True))
    for part, weights, _ in parts:
        part.projections.flatten(0, 1)[batch.slot_mapping] = torch.cat(
            compressor_inputs(x, weights), dim=-1)

    for part, weights, overlap in parts:
        compress_pool(part.projections, part.entries, weights.position_bias, weights.norm,
                      freqs, batch.block_tables, batch.seq_lens, batch.query_start_loc,
                      batch.max_query_len, ratio=part.ratio, overlap=overlap,
                      norm_eps=cfg.rms_norm_eps)
    keys, valid = [], []
    for r in requests:
        k, v = _request_keys(x[r.rows], p.q_residual[r.rows], batch.positions[r.rows], r, w,
                             cfg, cache, freqs)
        keys.append(k)
        valid.append(v)
    width = max(k.shape[1] for k in keys)
    entries = torch.cat([torch.nn.functional.pad(k, (0, 0, 0, width - k.shape[1]))
                         for k in keys])
    mask = torch.cat([torch.nn.functional.pad(v, (0, width - v.shape[1])) for v in valid])
    return attend(p.q, entries, mask, w, cfg, batch.positions, freqs)


def _request_keys(x: torch.Tensor, q_residual: torch.Tensor, positions: torch.Tensor,
                  r: StepRequest, w: AttentionWeights, cfg: DeepseekV4Config,
                  cache: LayerCache, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each of the request's queries' keys: its window's raw entries, then the compressed
    entries it picks ([n, K, D], and [n, K] whether each is real)."""
    block_size = cache.kv.shape[1]
    window, real = window_positions(positions, cfg.sliding_window)
    keys = [cache.kv.flatten(0, 1)[token_slots(r.table, window, block_size)]]
    valid = [real]
    part = cache.compressor
    count = 0 if part is None else (r.last + 1) // part.ratio  # entries the last query sees
    if part is not None and count:
        seen = torch.arange(count, device=x.device)
        entries = part.entries.flatten(0, 1)[part.entry_slots(r.table, seen)]
        index_keys = None
        if cache.indexer is not None:
            index_keys = cache.indexer.entries.flatten(0, 1)[
                cache.indexer.entry_slots(r.table, seen)]
        picks = compressed_picks(x, q_residual, positions, count, w, cfg, freqs, part.ratio,
                                 index_keys)
        keys.append(entries[picks.clamp(min=0)])
        valid.append(picks >= 0)
    return torch.cat(keys, dim=1), torch.cat(valid, dim=1)
