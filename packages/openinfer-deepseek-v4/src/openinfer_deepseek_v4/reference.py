"""DeepSeek-V4 over one whole sequence (positions 0..T-1), in plain torch from the reference
ops (`kernels/`, and openinfer-kernels' shared ones): the oracle the serving path (`model.py`
on the paged cache) is tested against. The serving path is built from the same pieces
(`project`, `compressed_picks`, `attend`, `around`, `moe`, ...), only its keys come from the
cache. Spec: shared deepseek-v4.md §3-§6."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.kernels.compress import compress_kv_ref
from openinfer_deepseek_v4.kernels.indexer import indexer_scores_ref
from openinfer_deepseek_v4.kernels.indexer.ordered_topk import indexer_topk_ordered_ref
from openinfer_deepseek_v4.kernels.mhc import (
    hc_collapse_ref,
    hc_expand_ref,
    hc_head_ref,
    hc_weights_ref,
)
from openinfer_deepseek_v4.kernels.moe import route_hash_ref, route_topk_ref, swiglu_clamped_ref
from openinfer_deepseek_v4.kernels.quant_sim import fp8_round_nope, indexer_round_ref
from openinfer_deepseek_v4.kernels.rotary import rotary_interleaved_ref
from openinfer_deepseek_v4.kernels.sparse_attention import sink_attention_ref
from openinfer_deepseek_v4.quantized import (
    Fp4Experts,
    Weight,
    grouped_linear,
    linear,
    routed_experts,
)


@dataclass(frozen=True, slots=True)
class CompressorWeights:
    kv: torch.Tensor  # [c*d, H]
    gate: torch.Tensor  # [c*d, H]
    position_bias: torch.Tensor  # [ratio, c*d]
    norm: torch.Tensor  # [d]


@dataclass(frozen=True, slots=True)
class IndexerWeights:
    compressor: CompressorWeights
    q_b: Weight  # [heads * d, q_lora_rank]
    weights_proj: torch.Tensor  # [heads, H]


@dataclass(frozen=True, slots=True)
class AttentionWeights:
    q_a: Weight  # [q_lora_rank, H]
    q_a_norm: torch.Tensor
    q_b: Weight  # [heads * D, q_lora_rank]
    kv: Weight  # [D, H]
    kv_norm: torch.Tensor
    o_a: Weight  # [groups * o_lora_rank, heads * D / groups]
    o_b: Weight  # [H, groups * o_lora_rank]
    sinks: torch.Tensor  # [heads]
    compressor: CompressorWeights | None  # the layers with compressed KV
    indexer: IndexerWeights | None  # the ratio-4 layers


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm in fp32, times the (fp32) weight, back to x's dtype."""
    normed = x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps)
    return (normed if weight is None else weight.float() * normed).to(x.dtype)


def layer_freqs(cfg: DeepseekV4Config, layer: int) -> torch.Tensor:
    """The layer's rotary frequencies: plain in the window-only layers, YaRN in the others."""
    return cfg.rope_freqs(compressed=cfg.attention_kinds[layer] != "window")


@dataclass(frozen=True, slots=True)
class Projected:
    """One attention sublayer's per-token projections."""

    q_residual: torch.Tensor  # [T, q_lora_rank]: the low-rank query, the indexer's input too
    q: torch.Tensor  # [T, heads, D]: normed per head, rotated
    kv: torch.Tensor  # [T, D]: the token's raw entry (key and value), normed, rotated


def project(x: torch.Tensor, w: AttentionWeights, cfg: DeepseekV4Config,
            positions: torch.Tensor, freqs: torch.Tensor) -> Projected:
    """x [T, H] (the normed collapsed streams) at `positions` -> the queries and raw entries."""
    t, eps = x.shape[0], cfg.rms_norm_eps
    q_residual = rms_norm(linear(x, w.q_a), w.q_a_norm, eps)
    q = rms_norm(linear(q_residual, w.q_b).view(t, cfg.num_heads, cfg.head_dim), None, eps)
    kv = rotary_interleaved_ref(rms_norm(linear(x, w.kv), w.kv_norm, eps), positions, freqs)
    if cfg.quant_sim:
        kv = fp8_round_nope(kv, cfg.rope_head_dim)
    return Projected(q_residual, rotary_interleaved_ref(q, positions, freqs), kv)


def compressor_inputs(x: torch.Tensor, w: CompressorWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """A compressor's per-token projections (kv, gate), [T, c*d] each: what its entries pool."""
    return x @ w.kv.t(), x @ w.gate.t()


def _compress(x: torch.Tensor, w: CompressorWeights, freqs: torch.Tensor, ratio: int,
              overlap: bool, eps: float) -> torch.Tensor:
    return compress_kv_ref(*compressor_inputs(x, w), w.position_bias, w.norm, freqs,
                           ratio=ratio, overlap=overlap, norm_eps=eps)


def round_entries(entries: torch.Tensor, cfg: DeepseekV4Config, indexer: bool) -> torch.Tensor:
    """Compressed entries as the model rounds them where `cfg.quant_sim`: the indexer's keys
    rotated and to FP4, the main entries' non-rotary dims to FP8 (`quant_sim.py`)."""
    if not cfg.quant_sim:
        return entries
    return indexer_round_ref(entries) if indexer else fp8_round_nope(entries, cfg.rope_head_dim)


def window_positions(positions: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's sliding window, positions t - size + 1 .. t: ([T, size] positions clamped
    at 0, [T, size] whether each is real)."""
    window = positions[:, None] - size + 1 + torch.arange(size, device=positions.device)
    return window.clamp(min=0), window >= 0


def compressed_picks(x: torch.Tensor, q_residual: torch.Tensor, positions: torch.Tensor,
                     num_entries: int, w: AttentionWeights, cfg: DeepseekV4Config,
                     freqs: torch.Tensor, ratio: int,
                     index_keys: torch.Tensor | None) -> torch.Tensor:
    """Which of the first `num_entries` compressed entries each query attends to, [T, K]
    (-1: none): with `index_keys` (the CSA layers' indexer entries, [num_entries, d]) the
    indexer's top k of those it can see (ties to the earlier entry, so that the picks do not
    depend on how many entries the step has); without (HCA), every one it can see."""
    if index_keys is None:
        picks = torch.arange(num_entries, device=x.device).expand(x.shape[0], -1)
        return torch.where(picks < ((positions + 1) // ratio)[:, None], picks, -1)
    q, weights = indexer_inputs(x, q_residual, positions, w, cfg, freqs)
    scores = indexer_scores_ref(q, index_keys, weights, softmax_scale=cfg.index_head_dim ** -0.5,
                                weights_scale=cfg.index_n_heads ** -0.5)
    return indexer_topk_ordered_ref(scores, positions, ratio=ratio, top_k=cfg.index_topk)


def indexer_inputs(x: torch.Tensor, q_residual: torch.Tensor, positions: torch.Tensor,
                   w: AttentionWeights, cfg: DeepseekV4Config,
                   freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The indexer's queries [T, heads, d] (rotated) and per-head weights [T, heads]."""
    assert w.indexer is not None
    t, idx = x.shape[0], w.indexer
    q = linear(q_residual, idx.q_b).view(t, cfg.index_n_heads, cfg.index_head_dim)
    q = rotary_interleaved_ref(q, positions, freqs)
    return (indexer_round_ref(q) if cfg.quant_sim else q), linear(x, idx.weights_proj)


def attend(q: torch.Tensor, entries: torch.Tensor, valid: torch.Tensor, w: AttentionWeights,
           cfg: DeepseekV4Config, positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Each query (q [T, heads, D]) over its own entries ([T, K, D], `valid` [T, K]) and its
    head's sink, the values' rotation undone, then the grouped output projection: [T, H]."""
    out = sink_attention_ref(q, entries, valid, w.sinks, cfg.head_dim ** -0.5)
    return attention_output(out, w, cfg, positions, freqs)


def attention_output(out: torch.Tensor, w: AttentionWeights, cfg: DeepseekV4Config,
                     positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """The attention's per-head outputs [T, heads, D] -> [T, H]: the values' rotation undone,
    then the grouped output projection."""
    out = rotary_interleaved_ref(out, positions, freqs, inverse=True)  # values carried rotary
    grouped = grouped_linear(out.reshape(out.shape[0], cfg.o_groups, -1), w.o_a)
    return linear(grouped.reshape(out.shape[0], -1), w.o_b)


def attention(x: torch.Tensor, w: AttentionWeights, cfg: DeepseekV4Config,
              layer: int) -> torch.Tensor:
    """One attention sublayer over a whole sequence: x [T, H] (the normed collapsed streams)
    -> [T, H]. Each query attends to the raw entries of its window and, in the compressed
    layers, to compressed entries: all it can see (HCA) or the indexer's picks (CSA); plus
    its head's sink."""
    kind, ratio, eps = cfg.attention_kinds[layer], cfg.compress_ratios[layer], cfg.rms_norm_eps
    freqs = layer_freqs(cfg, layer)
    positions = torch.arange(x.shape[0], device=x.device)
    p = project(x, w, cfg, positions, freqs)
    window, real = window_positions(positions, cfg.sliding_window)
    entries, valid = [p.kv[window]], [real]
    if kind != "window":
        assert w.compressor is not None
        compressed = round_entries(_compress(x, w.compressor, freqs, ratio, kind == "csa", eps),
                                   cfg, indexer=False)
        keys = None
        if kind == "csa":
            assert w.indexer is not None
            keys = round_entries(_compress(x, w.indexer.compressor, freqs, ratio, True, eps),
                                 cfg, indexer=True)
        if compressed.shape[0]:
            picks = compressed_picks(x, p.q_residual, positions, compressed.shape[0], w, cfg,
                                     freqs, ratio, keys)
            entries.append(compressed[picks.clamp(min=0)])
            valid.append(picks >= 0)
    return attend(p.q, torch.cat(entries, dim=1), torch.cat(valid, dim=1), w, cfg, positions,
                  freqs)


@dataclass(frozen=True, slots=True)
class HyperConnectionWeights:
    fn: torch.Tensor  # [(2 + N) N, N H] around a sublayer; [N, N H] for the head
    base: torch.Tensor
    scale: torch.Tensor


@dataclass(frozen=True, slots=True)
class MoEWeights:
    gate: torch.Tensor  # [E, H] router
    bias: torch.Tensor | None  # [E] selection bias (score layers)
    tid2eid: torch.Tensor | None  # [vocab, k] token id -> experts (hash layers)
    gate_up: torch.Tensor | Fp4Experts  # [E, 2I, H], or every expert's FP4 weights
    down: torch.Tensor | None  # [E, H, I] (None with FP4 experts)
    shared_gate_up: Weight  # [2I, H]
    shared_down: Weight  # [H, I]


@dataclass(frozen=True, slots=True)
class LayerWeights:
    attn_hc: HyperConnectionWeights
    attn_norm: torch.Tensor
    attention: AttentionWeights
    ffn_hc: HyperConnectionWeights
    ffn_norm: torch.Tensor
    moe: MoEWeights


@dataclass(frozen=True, slots=True)
class ModelWeights:
    embed: torch.Tensor  # [vocab, H]
    layers: list[LayerWeights]
    hc_head: HyperConnectionWeights
    norm: torch.Tensor
    lm_head: torch.Tensor  # [vocab, H]


def moe(x: torch.Tensor, token_ids: torch.Tensor, w: MoEWeights,
        cfg: DeepseekV4Config) -> torch.Tensor:
    """Routed experts (by token id in the hash layers, by biased top-k otherwise) plus the
    shared expert: x [T, H] -> [T, H]."""
    weights, ids = route(x, token_ids, w, cfg)
    routed = routed_experts(x, ids, weights, w.gate_up, w.down, cfg.swiglu_limit)
    return routed + shared_expert(x, w, cfg)


def route(x: torch.Tensor, token_ids: torch.Tensor, w: MoEWeights,
          cfg: DeepseekV4Config) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's experts: (weights [T, k] fp32, global expert ids [T, k] int64)."""
    logits = x @ w.gate.t()
    if w.tid2eid is not None:
        return route_hash_ref(logits, w.tid2eid, token_ids, cfg.routed_scaling_factor)
    assert w.bias is not None
    return route_topk_ref(logits, w.bias, cfg.top_k, cfg.routed_scaling_factor)


def shared_expert(x: torch.Tensor, w: MoEWeights, cfg: DeepseekV4Config) -> torch.Tensor:
    """x [T, H] -> [T, H]."""
    return linear(swiglu_clamped_ref(linear(x, w.shared_gate_up), cfg.swiglu_limit),
                  w.shared_down)


def around(streams: torch.Tensor, hc: HyperConnectionWeights, norm: torch.Tensor,
           sublayer: Callable[[torch.Tensor], torch.Tensor],
           cfg: DeepseekV4Config) -> torch.Tensor:
    """One sublayer inside the hyper-connections: collapse, norm, sublayer, expand."""
    pre, post, comb = hc_weights_ref(streams, hc.fn, hc.base, hc.scale, hc_eps=cfg.hc_eps,
                                     norm_eps=cfg.rms_norm_eps,
                                     sinkhorn_iters=cfg.hc_sinkhorn_iters)
    out = sublayer(rms_norm(hc_collapse_ref(streams, pre), norm, cfg.rms_norm_eps))
    return hc_expand_ref(streams, out, post, comb)


def embed_streams(token_ids: torch.Tensor, w: ModelWeights,
                  cfg: DeepseekV4Config) -> torch.Tensor:
    """Token ids [T] -> the residual streams [T, N, H], all N starting as the embedding."""
    return w.embed[token_ids].unsqueeze(1).expand(-1, cfg.hc_mult, -1).contiguous()


def head_logits(streams: torch.Tensor, w: ModelWeights, cfg: DeepseekV4Config) -> torch.Tensor:
    """Streams [T, N, H] -> fp32 logits [T, vocab]: the head's collapse, norm, projection."""
    head = w.hc_head
    last = hc_head_ref(streams, head.fn, head.base, head.scale, hc_eps=cfg.hc_eps,
                       norm_eps=cfg.rms_norm_eps)
    return logits(last, w, cfg)


def logits(last: torch.Tensor, w: ModelWeights, cfg: DeepseekV4Config) -> torch.Tensor:
    """The collapsed last hidden states [T, H] -> fp32 logits [T, vocab]: norm, projection."""
    return project_logits(rms_norm(last, w.norm, cfg.rms_norm_eps), w)


def project_logits(normed: torch.Tensor, w: ModelWeights) -> torch.Tensor:
    """The normed last hidden states [T, H] -> fp32 logits [T, vocab]."""
    return (normed @ w.lm_head.t()).float()


def forward(token_ids: torch.Tensor, w: ModelWeights, cfg: DeepseekV4Config) -> torch.Tensor:
    """The whole model over one sequence: token ids [T] -> fp32 logits [T, vocab]."""
    streams = embed_streams(token_ids, w, cfg)
    for i, layer in enumerate(w.layers):
        streams = around(streams, layer.attn_hc, layer.attn_norm,
                         partial(attention, w=layer.attention, cfg=cfg, layer=i), cfg)
        streams = around(streams, layer.ffn_hc, layer.ffn_norm,
                         partial(moe, token_ids=token_ids, w=layer.moe, cfg=cfg), cfg)
    return head_logits(streams, w, cfg)
