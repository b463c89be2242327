"""The Qwen3 forward pass over a mixed batch of prefill chunks and decode tokens on paged KV."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from openinfer_core.interfaces.attention import AttentionBackend
from openinfer_core.interfaces.kv import KVManager
from openinfer_core.interfaces.model import ForwardBatch
from openinfer_kernels import (
    embedding,
    fused_add_rms_norm,
    linear,
    linear_add_rms_norm,
    linear_silu_mul,
    lm_head_logits,
    qk_norm_rope,
    qk_norm_rope_append,
    rms_norm,
    rope_cos_sin,
)
from openinfer_kernels.compile_ahead import compile_ahead
from openinfer_kernels.sampling import SAMPLING_KERNELS
from openinfer_kvcache import KVBuffer, KVCacheSpec, PagedKVManager
from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.weights import LayerWeights, Qwen3Weights


class Qwen3Model:
    """Weights, rotary table and KV buffer of one Qwen3 model on one device."""

    def __init__(self, cfg: Qwen3Config, weights: Qwen3Weights, attention: AttentionBackend,
                 *, max_model_len: int, device: torch.device, dtype: torch.dtype) -> None:
        self.cfg = cfg
        self.w = weights
        self.attention = attention
        # A backend's `attend_appended`, when it has one: then q/k norm + rotary also appends.
        self._attend_appended = getattr(attention, "attend_appended", None)
        self.vocab_size = cfg.vocab_size
        self.max_model_len = max_model_len
        self.device = device
        self.dtype = dtype
        self.cos_sin = rope_cos_sin(max_model_len, cfg.head_dim, cfg.rope_theta, device)
        self.scale = cfg.head_dim ** -0.5
        self.kv: KVBuffer | None = None
        self.cuda_graph_safe = bool(getattr(attention, "cuda_graph_safe", False))
        self.cuda_graph_max_tokens = (int(getattr(attention, "cuda_graph_max_tokens", 0))
                                      if self.cuda_graph_safe else 0)
        self.sampling_kernels = SAMPLING_KERNELS
        self.compile_ahead = compile_ahead
        self.weight_bytes = weights.decode_bytes()

    def kv_spec(self, block_size: int) -> KVCacheSpec:
        return KVCacheSpec(self.cfg.num_layers, self.cfg.num_kv_heads, self.cfg.head_dim,
                           self.dtype, block_size)

    def kv_bytes_per_block(self, block_size: int) -> int:
        return self.kv_spec(block_size).bytes_per_block

    def create_kv_cache(self, num_blocks: int, block_size: int) -> KVManager:
        self.kv = KVBuffer(self.kv_spec(block_size), num_blocks, self.device)
        return PagedKVManager(num_blocks, block_size)

    def kv_block_tensors(self) -> list[torch.Tensor]:
        """Layer-major: layer 0's keys, its values, layer 1's keys, ..."""
        if self.kv is None:
            raise RuntimeError("create_kv_cache() must run before kv_block_tensors()")
        return [t for pair in zip(self.kv.k, self.kv.v, strict=True) for t in pair]

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if self.kv is None:
            raise RuntimeError("create_kv_cache() must run before forward()")
        eps = self.cfg.rms_norm_eps
        hidden = embedding(batch.input_ids, self.w.embed)
        residual = hidden
        # The previous layer's MLP activation and down weight: its down projection runs with
        # this layer's add + norm (`linear_add_rms_norm`: a split-K sum inside the norm).
        pending: tuple[torch.Tensor, torch.Tensor] | None = None
        for n, layer in enumerate(self.w.layers):
            if pending is None:
                x = rms_norm(hidden, layer.input_norm, eps)
            else:
                x, residual = linear_add_rms_norm(*pending, residual, layer.input_norm, eps)
            hidden = self._attention(n, layer, x, batch)
            x, residual = fused_add_rms_norm(hidden, residual, layer.post_norm, eps)
            pending = (linear_silu_mul(x, layer.gate_up), layer.down)
        assert pending is not None
        hidden = linear(*pending)
        # Only rows that sample need the final norm and the vocabulary projection.
        rows = batch.logits_indices
        last, _ = fused_add_rms_norm(hidden[rows], residual[rows], self.w.final_norm, eps)
        return lm_head_logits(last, self.w.lm_head)

    def _attention(self, n: int, layer: LayerWeights, x: torch.Tensor,
                   batch: ForwardBatch) -> torch.Tensor:
        assert self.kv is not None
        cfg = self.cfg
        t = x.shape[0]
        qkv = (linear(x, layer.qkv) if layer.qkv_bias is None
               else F.linear(x, layer.qkv, layer.qkv_bias))
        q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.reshape(t, cfg.num_heads, cfg.head_dim)
        k = k.reshape(t, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(t, cfg.num_kv_heads, cfg.head_dim)
        if self._attend_appended is not None:  # K/V go to the cache in the norm/rotary kernel
            q = qk_norm_rope_append(q, k, v, layer.q_norm, layer.k_norm, cfg.rms_norm_eps,
                                    batch.positions, self.cos_sin, self.kv.k[n], self.kv.v[n],
                                    batch.slot_mapping)
            out = self._attend_appended(q, self.kv.k[n], self.kv.v[n], batch, self.scale)
        else:
            q, k = qk_norm_rope(q, k, layer.q_norm, layer.k_norm, cfg.rms_norm_eps,
                                batch.positions, self.cos_sin)
            out = self.attention.attend(q, k, v, self.kv.k[n], self.kv.v[n], batch, self.scale)
        return linear(out.reshape(t, cfg.q_size), layer.o_proj)
