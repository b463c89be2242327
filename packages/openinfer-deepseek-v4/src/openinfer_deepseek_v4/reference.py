"""DeepSeek-V4 over one whole sequence (positions 0..T-1), in plain torch from the
openinfer-kernels reference ops: the oracle the serving path (paged KV, incremental
compressor state) is tested against. Spec: shared deepseek-v4.md §3-§6."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_kernels.compress import compress_kv_ref
from openinfer_kernels.gemm import grouped_linear_ref
from openinfer_kernels.indexer import indexer_scores_ref, indexer_topk_ref
from openinfer_kernels.mhc import hc_collapse_ref, hc_expand_ref, hc_head_ref, hc_weights_ref
from openinfer_kernels.moe import (
    moe_experts_ref,
    route_hash_ref,
    route_topk_ref,
    swiglu_clamped_ref,
)
from openinfer_kernels.rotary import rotary_interleaved_ref
from openinfer_kernels.sparse_attention import sink_attention_ref


@dataclass(frozen=True, slots=True)
class CompressorWeights:
    kv: torch.Tensor  # [c*d, H]
    gate: torch.Tensor  # [c*d, H]
    position_bias: torch.Tensor  # [ratio, c*d]
    norm: torch.Tensor  # [d]


@dataclass(frozen=True, slots=True)
class IndexerWeights:
    compressor: CompressorWeights
    q_b: torch.Tensor  # [heads * d, q_lora_rank]
    weights_proj: torch.Tensor  # [heads, H]


@dataclass(frozen=True, slots=True)
class AttentionWeights:
    q_a: torch.Tensor  # [q_lora_rank, H]
    q_a_norm: torch.Tensor
    q_b: torch.Tensor  # [heads * D, q_lora_rank]
    kv: torch.Tensor  # [D, H]
    kv_norm: torch.Tensor
    o_a: torch.Tensor  # [groups * o_lora_rank, heads * D / groups]
    o_b: torch.Tensor  # [H, groups * o_lora_rank]
    sinks: torch.Tensor  # [heads]
    compressor: CompressorWeights | None  # the layers with compressed KV
    indexer: IndexerWeights | None  # the ratio-4 layers


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm in fp32, times the (fp32) weight, back to x's dtype."""
    normed = x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps)
    return (normed if weight is None else weight.float() * normed).to(x.dtype)


def _compress(x: torch.Tensor, w: CompressorWeights, freqs: torch.Tensor, ratio: int,
              overlap: bool, eps: float) -> torch.Tensor:
    return compress_kv_ref(x @ w.kv.t(), x @ w.gate.t(), w.position_bias, w.norm, freqs,
                           ratio=ratio, overlap=overlap, norm_eps=eps)


def attention(x: torch.Tensor, w: AttentionWeights, cfg: DeepseekV4Config,
              layer: int) -> torch.Tensor:
    """One attention sublayer over a whole sequence: x [T, H] (the normed collapsed streams)
    -> [T, H]. Each query attends to the raw entries of its window and, in the compressed
    layers, to compressed entries: all it can see (HCA) or the indexer's picks (CSA); plus
    its head's sink."""
    t, eps, heads, dim = x.shape[0], cfg.rms_norm_eps, cfg.num_heads, cfg.head_dim
    kind, ratio = cfg.attention_kinds[layer], cfg.compress_ratios[layer]
    freqs = cfg.rope_freqs(compressed=kind != "window")
    positions = torch.arange(t)
    q_residual = rms_norm(x @ w.q_a.t(), w.q_a_norm, eps)
    q = rms_norm((q_residual @ w.q_b.t()).view(t, heads, dim), None, eps)
    q = rotary_interleaved_ref(q, positions, freqs)
    kv = rotary_interleaved_ref(rms_norm(x @ w.kv.t(), w.kv_norm, eps), positions, freqs)

    # the window: positions t - W + 1 .. t
    window = positions[:, None] - cfg.sliding_window + 1 + torch.arange(cfg.sliding_window)
    entries, valid = [kv[window.clamp(min=0)]], [window >= 0]
    if kind != "window":
        assert w.compressor is not None
        compressed = _compress(x, w.compressor, freqs, ratio, kind == "csa", eps)
        if kind == "csa":
            assert w.indexer is not None
            picks = _indexer_picks(x, q_residual, w.indexer, cfg, freqs, ratio)
        else:  # every entry the query can see
            picks = torch.arange(compressed.shape[0]).expand(t, -1)
            picks = torch.where(picks < ((positions + 1) // ratio)[:, None], picks, -1)
        if compressed.shape[0]:
            entries.append(compressed[picks.clamp(min=0)])
            valid.append(picks >= 0)
    out = sink_attention_ref(q, torch.cat(entries, dim=1), torch.cat(valid, dim=1), w.sinks,
                             dim ** -0.5)
    out = rotary_interleaved_ref(out, positions, freqs, inverse=True)  # values carried rotary
    grouped = grouped_linear_ref(out.reshape(t, cfg.o_groups, -1), w.o_a)
    return grouped.reshape(t, -1) @ w.o_b.t()


def _indexer_picks(x: torch.Tensor, q_residual: torch.Tensor, w: IndexerWeights,
                   cfg: DeepseekV4Config, freqs: torch.Tensor, ratio: int) -> torch.Tensor:
    t = x.shape[0]
    positions = torch.arange(t)
    keys = _compress(x, w.compressor, freqs, ratio, True, cfg.rms_norm_eps)
    q = (q_residual @ w.q_b.t()).view(t, cfg.index_n_heads, cfg.index_head_dim)
    scores = indexer_scores_ref(rotary_interleaved_ref(q, positions, freqs), keys,
                                x @ w.weights_proj.t(),
                                softmax_scale=cfg.index_head_dim ** -0.5,
                                weights_scale=cfg.index_n_heads ** -0.5)
    return indexer_topk_ref(scores, positions, ratio=ratio, top_k=cfg.index_topk)


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
    gate_up: torch.Tensor  # [E, 2I, H]
    down: torch.Tensor  # [E, H, I]
    shared_gate_up: torch.Tensor  # [2I, H]
    shared_down: torch.Tensor  # [H, I]


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
    logits = x @ w.gate.t()
    if w.tid2eid is not None:
        weights, ids = route_hash_ref(logits, w.tid2eid, token_ids, cfg.routed_scaling_factor)
    else:
        assert w.bias is not None
        weights, ids = route_topk_ref(logits, w.bias, cfg.top_k, cfg.routed_scaling_factor)
    routed = moe_experts_ref(x, ids, weights, w.gate_up, w.down, cfg.swiglu_limit)
    shared = swiglu_clamped_ref(x @ w.shared_gate_up.t(), cfg.swiglu_limit) @ w.shared_down.t()
    return routed + shared


def _around(streams: torch.Tensor, hc: HyperConnectionWeights, norm: torch.Tensor,
            sublayer: Callable[[torch.Tensor], torch.Tensor],
            cfg: DeepseekV4Config) -> torch.Tensor:
    """One sublayer inside the hyper-connections: collapse, norm, sublayer, expand."""
    pre, post, comb = hc_weights_ref(streams, hc.fn, hc.base, hc.scale, hc_eps=cfg.hc_eps,
                                     norm_eps=cfg.rms_norm_eps,
                                     sinkhorn_iters=cfg.hc_sinkhorn_iters)
    out = sublayer(rms_norm(hc_collapse_ref(streams, pre), norm, cfg.rms_norm_eps))
    return hc_expand_ref(streams, out, post, comb)


def forward(token_ids: torch.Tensor, w: ModelWeights, cfg: DeepseekV4Config) -> torch.Tensor:
    """The whole model over one sequence: token ids [T] -> fp32 logits [T, vocab]."""
    x = w.embed[token_ids]
    streams = x.unsqueeze(1).expand(-1, cfg.hc_mult, -1).contiguous()  # all start equal
    for i, layer in enumerate(w.layers):
        streams = _around(streams, layer.attn_hc, layer.attn_norm,
                          partial(attention, w=layer.attention, cfg=cfg, layer=i), cfg)
        streams = _around(streams, layer.ffn_hc, layer.ffn_norm,
                          partial(moe, token_ids=token_ids, w=layer.moe, cfg=cfg), cfg)
    head = w.hc_head
    last = hc_head_ref(streams, head.fn, head.base, head.scale, hc_eps=cfg.hc_eps,
                       norm_eps=cfg.rms_norm_eps)
    return (rms_norm(last, w.norm, cfg.rms_norm_eps) @ w.lm_head.t()).float()
