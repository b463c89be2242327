"""Qwen3.5's two token mixers over a flattened batch: gated full attention (paged K/V) and the
Gated DeltaNet (a state slot per request)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from openinfer_core.interfaces.attention import AttentionBackend
from openinfer_core.interfaces.model import ForwardBatch
from openinfer_kernels import linear
from openinfer_qwen35.config import Qwen35Config
from openinfer_qwen35.kernels.attention_prologue import qk_norm_partial_rope
from openinfer_qwen35.kernels.gated_delta_rule import gated_delta_rule_varlen
from openinfer_qwen35.kernels.gated_delta_rule.decode_triton import gated_delta_rule_decode
from openinfer_qwen35.kernels.gated_norm import gated_rms_norm
from openinfer_qwen35.kernels.output_gate import output_gate
from openinfer_qwen35.kernels.short_conv import causal_conv1d
from openinfer_qwen35.kernels.short_conv.decode_triton import causal_conv1d_decode
from openinfer_qwen35.state_cache import StepRows
from openinfer_qwen35.weights import AttentionWeights, DeltaNetWeights


def gated_attention(cfg: Qwen35Config, w: AttentionWeights, x: torch.Tensor,
                    batch: ForwardBatch, attention: AttentionBackend, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Attention with per-head q/k norms, rotary on each head's first `rotary_dim` dims and
    a sigmoid output gate per channel; appends this step's K/V. [T, H] -> the gated heads
    [T, Hq * D], o_proj's input (the model projects it with the residual add + norm)."""
    t, d = x.shape[0], cfg.head_dim
    q, k, v, gate = linear(x, w.qkvg).split(
        [cfg.q_size, cfg.kv_size, cfg.kv_size, cfg.q_size], dim=-1)
    q, k, v = qk_norm_partial_rope(
        q.reshape(t, cfg.num_heads, d), k.reshape(t, cfg.num_kv_heads, d),
        v.reshape(t, cfg.num_kv_heads, d), w.q_norm, w.k_norm, cfg.rms_norm_eps,
        batch.positions, cos_sin)
    out = attention.attend(q, k, v, k_cache, v_cache, batch, d ** -0.5)
    return output_gate(out.reshape(t, cfg.q_size), gate)


def gated_delta_net(cfg: Qwen35Config, w: DeltaNetWeights, x: torch.Tensor,
                    batch: ForwardBatch, rows: StepRows, conv_state: torch.Tensor,
                    recurrent_state: torch.Tensor) -> torch.Tensor:
    """The linear-attention layer: in-projections, the short convolution, the gated delta
    rule, a norm gated by z. Reads and writes each row's slot of `conv_state` and
    `recurrent_state`. [T, H] -> [T, value_dim], out_proj's input (the model projects it
    with the residual add + norm)."""
    t, heads = x.shape[0], cfg.linear_value_heads
    mixed, z, b, a = linear(x, w.in_proj).split(
        [cfg.conv_dim, cfg.value_dim, heads, heads], dim=-1)
    if x.is_cuda and batch.max_query_len == 1:
        # Decode on the GPU: the convolution and the rule each one kernel, in place on the
        # rows' slots, the gates made inside the rule's kernel.
        mixed = causal_conv1d_decode(mixed, w.conv, conv_state, rows.slots, rows.fresh)
        core = gated_delta_rule_decode(mixed, a, b, w.a_neg, w.dt_bias, recurrent_state,
                                       rows.slots, rows.fresh, cfg.linear_key_heads)
    else:
        mixed = causal_conv1d(mixed, w.conv, conv_state, rows.slots, batch.query_start_loc,
                              rows.fresh, batch.max_query_len)
        q, k, v = mixed.split([cfg.key_dim, cfg.key_dim, cfg.value_dim], dim=-1)
        beta = b.sigmoid()
        g = w.a_neg * F.softplus(a.float() + w.dt_bias)  # log of the decay, <= 0
        core = gated_delta_rule_varlen(
            q.reshape(t, cfg.linear_key_heads, cfg.linear_key_dim),
            k.reshape(t, cfg.linear_key_heads, cfg.linear_key_dim),
            v.reshape(t, heads, cfg.linear_value_dim), g, beta, recurrent_state, rows.slots,
            rows.fresh, batch.query_start_loc, decode=batch.max_query_len == 1,
            plan=rows.plan)
    out = gated_rms_norm(core, z.reshape(t, heads, cfg.linear_value_dim), w.norm,
                         cfg.rms_norm_eps)
    return out.reshape(t, cfg.value_dim)
