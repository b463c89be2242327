"""One attention sublayer over a step's tokens on the paged cache (`kv_cache`): the math of
`reference.attention` over a whole sequence, with every request's keys read from its blocks by
slot. The step is batched: no loop over requests and no host sync (the widths are the step's
host-known bounds), with the Triton kernels on the GPU and their references on CPU:

1. project the queries and raw entries (the products of x, and those of the q lora's output,
   stacked by format: `shared_input.py`; the q lora's norm one `rms_rotary` op, the queries'
   and raw entries' norms and rotations one `q_kv_rms_rotary` op, cos and sin from the
   layer's position table); write the raw entries and the compressor
   projections into the step's slots of their window groups (`kv_cache`);
2. `store_and_pool` (`compress_pool` after the projections' store; at a decode step both in
   one launch): the compressed entries whose windows close in this step, from the
   projections (through their window group's table) into the entry pool of their full group,
   plain or periodic (with the official rounding on, stored as its codes:
   `kv_cache.entry_formats`);
3. per query, its keys as slots: the window's raw entries, and the compressed entries it sees
   (HCA: all; CSA: `indexer_topk_paged`'s picks); the slot arithmetic the layers share is
   made once a step (`StepSlots`). The indexer is replicated over tensor-parallel ranks, and on
   a prompt step its work grows with tokens x context: a step of at least
   `OPENINFER_DSV4_INDEXER_SPLIT_TOKENS` tokens (512) cuts its top-k by token, each rank the
   picks of its share, put together by one all-gather (the same picks: every rank has the same
   queries and keys);
4. `sparse_sink_attention` over those slots (its stores rotate the output back), then the
   output projection."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from openinfer_core.interfaces.model import ForwardBatch, TensorParallelGroup
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.kernels.compress import store_and_pool
from openinfer_deepseek_v4.kernels.indexer import indexer_topk_paged
from openinfer_deepseek_v4.kernels.quant_sim import (
    fp8_round_rows,
    indexer_round,
    indexer_round_rows,
)
from openinfer_deepseek_v4.kernels.rotary import q_kv_rms_rotary, rms_rotary
from openinfer_deepseek_v4.kernels.sparse_attention import sparse_sink_attention
from openinfer_deepseek_v4.kv_cache import CompressedCache, LayerCache
from openinfer_deepseek_v4.quantized import grouped_linear, linear
from openinfer_deepseek_v4.reference import (
    AttentionWeights,
    CompressorWeights,
)
from openinfer_deepseek_v4.shared_input import AttentionProducts
from openinfer_deepseek_v4.side_branches import takes_side
from openinfer_deepseek_v4.step_slots import StepSlots
from openinfer_kernels.side_stream import beside, wait_for

# Read when a tensor-parallel model is built: every rank builds its own with the same value.
INDEXER_SPLIT_ENV = "OPENINFER_DSV4_INDEXER_SPLIT_TOKENS"
INDEXER_SPLIT_TOKENS = 512


def indexer_split_tokens() -> int:
    """The fewest tokens of a step whose indexer top-k the tensor-parallel ranks split."""
    value = os.environ.get(INDEXER_SPLIT_ENV, str(INDEXER_SPLIT_TOKENS))
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{INDEXER_SPLIT_ENV}={value!r}: a token count of at least 1")
    return int(value)


@dataclass(frozen=True, slots=True)
class Rope:
    """A layer's rotary: its frequencies (the compressor's pooling rotates with them) and the
    cos | sin table of every position made from them (`kernels.rotary.rope_table`), on the
    device."""

    freqs: torch.Tensor  # [R / 2] fp32
    table: torch.Tensor  # [max_model_len, R] in the model's dtype


def paged_attention(x: torch.Tensor, w: AttentionWeights, products: AttentionProducts,
                    cfg: DeepseekV4Config, layer: int, cache: LayerCache, batch: ForwardBatch,
                    rope: Rope, slots: StepSlots, tp: TensorParallelGroup | None = None,
                    split_tokens: int = INDEXER_SPLIT_TOKENS,
                    side: frozenset[str] = frozenset()) -> torch.Tensor:
    """x [T, H] (the step's normed collapsed streams) -> [T, H]; `products`: the layer's
    products of x and of the q lora's output, stacked (`shared_input.attention_products` of
    `w`); `tp`: the tensor-parallel ranks, which share the indexer of a step of at least
    `split_tokens` tokens (`indexer_split_tokens()`); `side`: the branches that may run on the
    side stream (`side_branches`). Mutates the layer's cache: the step's raw entries,
    compressor projections and newly closed compressed entries."""
    kind = cfg.attention_kinds[layer]
    of_x = products.of_x(x)
    parts: list[tuple[CompressedCache, CompressorWeights, str, bool]] = []
    if cache.compressor is not None:
        assert w.compressor is not None
        parts.append((cache.compressor, w.compressor, "compressor", kind == "csa"))
    if cache.indexer is not None:
        assert w.indexer is not None
        parts.append((cache.indexer, w.indexer.compressor, "indexer", True))
    if parts and takes_side(side, "pool", x.shape[0]):
        # The pools beside the query path, on the side stream, waited for before the top-k;
        # the slots both streams read are made first, here (StepSlots caches them).
        for part, *_ in parts:
            slots.token_slots(part.projection_group)
            if cfg.quant_sim and part.fmt is None:
                slots.closed_entries(part.ratio, part.entries.shape[1], part.entry_group)
        _, pooled = beside(True, x.device, _store_and_pool, parts, of_x, cfg, cache, batch,
                           rope, slots)
        of_q, q = _project(of_x, products, w, cfg, batch, rope, cache, slots)
        wait_for(pooled)
    else:
        of_q, q = _project(of_x, products, w, cfg, batch, rope, cache, slots)
        _store_and_pool(parts, of_x, cfg, cache, batch, rope, slots)

    window = slots.window(cfg.sliding_window, cache.kv_group)
    pool = cache.kv.new_zeros((0, cfg.head_dim))
    picked = window.new_zeros((x.shape[0], 0))
    entry_format = None
    if cache.compressor is not None:
        pool = cache.compressor.entries.flatten(0, 1)
        entry_format = cache.compressor.fmt
        picked = _picked_slots(of_x, of_q, batch, cfg, cache, rope, slots, tp, split_tokens)
    # The values carry their keys' rotation: the attention's stores rotate it back.
    out = sparse_sink_attention(q, cache.kv.flatten(0, 1), pool, window, picked, w.sinks,
                                cfg.head_dim ** -0.5, entry_format=entry_format,
                                positions=batch.positions, rope_table=rope.table)
    return _output(out, w, cfg)


def _store_and_pool(parts: list[tuple[CompressedCache, CompressorWeights, str, bool]],
                    of_x: dict[str, torch.Tensor], cfg: DeepseekV4Config, cache: LayerCache,
                    batch: ForwardBatch, rope: Rope, slots: StepSlots) -> None:
    """Step 2 for the compressor and the indexer (`parts`): `reference.compressor_inputs`'
    two products (of the stacked products of x) into their rows, then the pooling of the
    windows that close (one launch at decode), rounded where quant_sim rounds them."""
    for part, weights, name, overlap in parts:
        store_and_pool(of_x[f"{name}.kv"], of_x[f"{name}.gate"],
                       slots.token_slots(part.projection_group), part.projections,
                       part.entries, weights.position_bias, weights.norm, rope.freqs,
                       batch.group_table(part.projection_group),
                       batch.group_table(part.entry_group), batch.seq_lens,
                       batch.query_start_loc, batch.max_query_len, ratio=part.ratio,
                       overlap=overlap, norm_eps=cfg.rms_norm_eps, store=part.fmt)
        if cfg.quant_sim and part.fmt is None:
            _round_closed_entries(part, slots, cfg, indexer=part is cache.indexer)


def _project(of_x: dict[str, torch.Tensor], products: AttentionProducts, w: AttentionWeights,
             cfg: DeepseekV4Config, batch: ForwardBatch, rope: Rope, cache: LayerCache,
             slots: StepSlots) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """`reference.project` from the products of x, with the raw entries written straight into
    their cache slots: (the products of the normed q lora output, q [T, heads, D] normed per
    head and rotated)."""
    t, eps, positions = of_x["q_a"].shape[0], cfg.rms_norm_eps, batch.positions
    q_residual = rms_rotary(of_x["q_a"], w.q_a_norm, positions, None, eps=eps)
    of_q = products.of_q(q_residual)
    # The queries and the raw entries normed and rotated in one op, the entries into their
    # cache slots (with quant_sim rounded as the model stores them, quant_sim.py).
    q = q_kv_rms_rotary(of_q["q_b"].view(t, cfg.num_heads, cfg.head_dim), of_x["kv"],
                        w.kv_norm, positions, rope.table, cache.kv.flatten(0, 1),
                        slots.token_slots(cache.kv_group), eps=eps,
                        fp8_rope_dims=cfg.rope_head_dim if cfg.quant_sim else None)
    return of_q, q


def _round_closed_entries(part: CompressedCache, slots: StepSlots, cfg: DeepseekV4Config,
                          indexer: bool) -> None:
    """Round, in place, the compressed entries `compress_pool` closed in this step (those whose
    window's last token is one of the step's) as the model rounds them
    (`reference.round_entries`); the rows kernels skip the -1 of tokens that close none."""
    rows = slots.closed_entries(part.ratio, part.entries.shape[1], part.entry_group)
    pool = part.entries.flatten(0, 1)
    if indexer:
        indexer_round_rows(pool, rows)
    else:
        fp8_round_rows(pool, rows, cfg.rope_head_dim)


def _output(out: torch.Tensor, w: AttentionWeights, cfg: DeepseekV4Config) -> torch.Tensor:
    """`reference.attention_output` after the values' rotation is undone (by
    `sparse_sink_attention`): the grouped output projection, then o_b."""
    t = out.shape[0]
    grouped = grouped_linear(out.view(t, cfg.o_groups, -1), w.o_a)
    return linear(grouped.reshape(t, -1), w.o_b)


def _picked_slots(of_x: dict[str, torch.Tensor], of_q: dict[str, torch.Tensor],
                  batch: ForwardBatch, cfg: DeepseekV4Config, cache: LayerCache, rope: Rope,
                  slots: StepSlots, tp: TensorParallelGroup | None,
                  split_tokens: int) -> torch.Tensor:
    """[T, K] int32: the compressed-entry slots each query attends to (-1: none). CSA: the
    indexer's top k of the entries it sees; HCA: all it sees. K is bounded by the step's
    longest request (`max_seq_len`), so no width depends on device values."""
    part = cache.compressor
    assert part is not None
    if cache.indexer is None:
        return slots.visible_entries(part.ratio, part.entries.shape[1], part.entry_group)
    q = of_q["indexer.q_b"]
    q = q.view(q.shape[0], cfg.index_n_heads, cfg.index_head_dim)
    q = rms_rotary(q, None, batch.positions, rope.table, eps=None)
    if cfg.quant_sim:
        q = indexer_round(q)  # [T, heads, d]: each head's row
    topk = partial(indexer_topk_paged, index_pool=cache.indexer.entries,
                   block_tables=batch.group_table(cache.indexer.entry_group),
                   query_start_loc=batch.query_start_loc, ratio=part.ratio,
                   block_size=part.projections.shape[1], top_k=cfg.index_topk,
                   softmax_scale=cfg.index_head_dim ** -0.5,
                   weights_scale=cfg.index_n_heads ** -0.5, as_slots=True,
                   max_entries=batch.max_seq_len // part.ratio, key_format=cache.indexer.fmt)
    weights = of_x["indexer.weights"]
    if tp is None or tp.size == 1 or q.shape[0] < split_tokens:
        return topk(q, weights, positions=batch.positions, requests=slots.requests)
    return _split_by_token(tp, topk, q, weights, batch.positions, slots.requests)


def _split_by_token(tp: TensorParallelGroup, topk: Callable[..., torch.Tensor],
                    q: torch.Tensor, weights: torch.Tensor, positions: torch.Tensor,
                    requests: torch.Tensor) -> torch.Tensor:
    """`topk` of every token, each rank computing a share of ceil(T / size) tokens (the last
    shares short or empty, padded with rows of -1), then all-gathered in rank order: [T, K]."""
    t, size = q.shape[0], tp.size
    share = -(-t // size)
    lo = min(tp.rank * share, t)
    hi = min(lo + share, t)
    part = topk(q[lo:hi], weights[lo:hi], positions=positions[lo:hi], requests=requests[lo:hi])
    if hi - lo < share:
        part = torch.cat([part, part.new_full((share - (hi - lo), part.shape[1]), -1)])
    width = part.shape[1]
    gathered = tp.all_gather(part)  # [share, size * K]: the ranks' shares side by side
    return gathered.view(share, size, width).transpose(0, 1).reshape(size * share, width)[:t]
