"""The Qwen3 forward pass over a mixed batch of prefill chunks and decode tokens on paged KV;
under tensor parallelism, one rank's shard of it, meeting the other ranks' in all-reduces after
the embedding, o_proj and down, and an all-gather of the logits."""

from __future__ import annotations

import os

import torch

from openinfer_core.interfaces.attention import (
    AttentionBackend,
    KVScales,
    supports_attend_appended,
)
from openinfer_core.interfaces.capabilities import supports_cuda_graphs
from openinfer_core.interfaces.kv import KVManager
from openinfer_core.interfaces.model import ForwardBatch, TensorParallelGroup
from openinfer_kernels import (
    embedding,
    embedding_part,
    fused_add_rms_norm,
    lm_head_logits,
    qk_norm_rope,
    qk_norm_rope_append,
    rope_cos_sin,
)
from openinfer_kernels.collective import (
    all_reduce_add_rms_norm,
    all_reduce_add_rms_norm_push,
    linear_push_add_rms_norm,
    push_ids,
)
from openinfer_kernels.gemm import linear_shares, sum_shares
from openinfer_kernels.sampling import SAMPLING_KERNELS
from openinfer_kvcache import KVBuffer, KVCacheSpec, PagedKVManager
from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.fp8_weights import Linear
from openinfer_qwen3.linears import (
    Activation,
    norm,
    project,
    project_add_rms_norm,
    project_silu_mul,
    project_wide,
    takes_quantized,
)
from openinfer_qwen3.weights import LayerWeights, Qwen3Shard, Qwen3Weights

# Read once: "1" hands a split-K o_proj / down product's shares to the push all-reduce
# unsummed (opt-in until measured on GPUs: `gpu_check.sh tplatency` with
# TP_VARIANTS=OPENINFER_TP_SHARES=1).
SHARES = os.environ.get("OPENINFER_TP_SHARES", "0") == "1"


class Qwen3Model:
    """Weights, rotary table and KV buffer of one Qwen3 model on one device; with `tp`, of
    the rank's shard (`shard`; `self.cfg` then has the rank's head counts and MLP width).
    The KV pages are in `kv_cache_dtype` (default: `dtype`); e4m3 pages are written and read
    with each layer's `kv_scales` (host tensors of all the model's KV heads, default 1.0; a
    rank keeps its own heads' scales, as it keeps their k/v projections)."""

    def __init__(self, cfg: Qwen3Config, weights: Qwen3Weights, attention: AttentionBackend,
                 *, max_model_len: int, device: torch.device, dtype: torch.dtype,
                 tp: TensorParallelGroup | None = None, shard: Qwen3Shard | None = None,
                 kv_cache_dtype: torch.dtype | None = None,
                 kv_scales: list[KVScales] | None = None) -> None:
        if (tp is None) != (shard is None):
            raise ValueError("a tensor-parallel Qwen3Model needs both `tp` and `shard`")
        self.kv_dtype = kv_cache_dtype or dtype
        # Per layer, what the attention calls get beside the cache: the scales of e4m3 pages
        # on the device, None for pages in the model's dtype (the backends' plain path).
        self._kv_scales: list[KVScales | None] = [None] * cfg.num_layers
        if self.kv_dtype == torch.float8_e4m3fn:
            scales = kv_scales or [KVScales.ones(cfg.num_kv_heads)] * cfg.num_layers
            if shard is not None:
                scales = [s.heads(shard.heads.kv_heads) for s in scales]
            self._kv_scales = [s.to(device) for s in scales]
        elif self.kv_dtype != dtype:
            raise ValueError(f"Qwen3 KV pages are in the model's dtype or float8_e4m3fn, not "
                             f"{self.kv_dtype}")
        self.tp = tp
        self.shard = shard
        self.cfg = cfg if shard is None else shard.local_config(cfg)
        self.w = weights
        self.attention = attention
        # A backend's `attend_appended`, when it has one: then q/k norm + rotary also appends.
        self._attend_appended = (attention.attend_appended
                                 if supports_attend_appended(attention) else None)
        self.vocab_size = cfg.vocab_size
        self.max_model_len = max_model_len
        self.device = device
        self.dtype = dtype
        self.cos_sin = rope_cos_sin(max_model_len, cfg.head_dim, cfg.rope_theta, device)
        self.scale = cfg.head_dim ** -0.5
        self.kv: KVBuffer | None = None
        # Capturable exactly where the attention backend is (capabilities.SupportsCudaGraphs).
        self.cuda_graph_safe = False
        self.cuda_graph_max_tokens = 0
        if tp is not None:  # our kernels over symmetric memory, if the group is asked to use them
            tp.enable_add_rms_norm(cfg.hidden_size, dtype, kernel=all_reduce_add_rms_norm,
                                   push_kernel=all_reduce_add_rms_norm_push,
                                   linear_kernel=linear_push_add_rms_norm,
                                   ids_kernel=push_ids)
        if supports_cuda_graphs(attention) and attention.cuda_graph_safe:
            self.cuda_graph_safe = True
            self.cuda_graph_max_tokens = attention.cuda_graph_max_tokens
        self.sampling_kernels = SAMPLING_KERNELS
        self.compile_ahead_safe = True  # capabilities.SupportsCompileAhead
        self.weight_bytes = weights.decode_bytes()
        self.pooling_hidden_size = cfg.hidden_size  # capabilities.SupportsPooling

    def kv_spec(self, block_size: int) -> KVCacheSpec:
        return KVCacheSpec(self.cfg.num_layers, self.cfg.num_kv_heads, self.cfg.head_dim,
                           self.kv_dtype, block_size)

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
        last = self.forward_hidden(batch)
        tp = self.tp
        if tp is None:
            out = batch.logits_out
            return lm_head_logits(last, self.w.lm_head,
                                  None if out is None else out[:last.shape[0]])
        logits = lm_head_logits(last, self.w.lm_head)
        logits = tp.all_gather(logits)  # [S, size * padded part]: the vocabulary, padded
        return logits if logits.shape[1] == self.vocab_size else (
            logits[:, :self.vocab_size].contiguous())

    def forward_hidden(self, batch: ForwardBatch) -> torch.Tensor:
        """The final-normed hidden states at `batch.logits_indices` (`SupportsPooling`;
        every rank has all of it under tensor parallelism)."""
        if self.kv is None:
            raise RuntimeError("create_kv_cache() must run before forward()")
        eps = self.cfg.rms_norm_eps
        tp = self.tp
        hidden = self._embed(batch.input_ids)
        residual = hidden
        # The previous layer's MLP activation and down weight: its down projection runs with
        # this layer's add + norm, as o_proj runs with the post-attention one
        # (`_project_add_norm`).
        pending: tuple[Activation, Linear] | None = None
        # On one device, a prompt-size step whose products run W8A8 gets each product's input
        # quantized by the kernel that makes it (linears.takes_quantized).
        fused = tp is None
        for n, layer in enumerate(self.w.layers):
            quantize = fused and takes_quantized(layer.qkv, hidden)
            if pending is None:
                x = norm(hidden, layer.input_norm, eps, quantize)
            else:
                x, residual = self._project_add_norm(*pending, residual, layer.input_norm,
                                                     quantize)
            attended = self._attention(n, layer, x, batch)
            x, residual = self._project_add_norm(
                attended, layer.o_proj, residual, layer.post_norm,
                fused and takes_quantized(layer.gate_up, hidden))
            pending = (project_silu_mul(x, layer.gate_up,
                                        fused and takes_quantized(layer.down, hidden)),
                       layer.down)
        assert pending is not None
        act, down = pending
        if tp is None:
            hidden = project(act, down)
        else:
            assert isinstance(act, torch.Tensor)  # (under tensor parallelism nothing is quantized)
            hidden = self._row_split(act, down)
        # Only rows that sample need the final norm and the vocabulary projection. In a decode
        # step every row samples its one token, in order: no gather then.
        rows = batch.logits_indices
        if batch.max_query_len > 1 or rows.shape[0] != hidden.shape[0]:
            hidden, residual = hidden[rows], residual[rows]
        last, _ = fused_add_rms_norm(hidden, residual, self.w.final_norm, eps)
        return last

    def _project_add_norm(self, x: Activation, w: Linear, residual: torch.Tensor,
                          norm_weight: torch.Tensor, quantize: bool = False
                          ) -> tuple[Activation, torch.Tensor]:
        """(rms_norm(x @ w.T + residual), x @ w.T + residual). On one device in one
        `linear_add_rms_norm` (a kept FP8 weight: `fp8_block_linear_add_rms_norm` at decode
        sizes, the W8A8 product then the add + norm at prompt sizes); under
        tensor parallelism the ranks' partial products meet in an all-reduce first, fused with
        the add + norm where the group has that kernel (`all_reduce_add_rms_norm`), or with
        the product too (`linear_all_reduce_add_rms_norm`, a decode step's few rows).
        `quantize` (one device only): the normed rows may come as an `Fp8Activation` for a
        next product that `takes_quantized`."""
        eps = self.cfg.rms_norm_eps
        if self.tp is None:
            return project_add_rms_norm(x, w, residual, norm_weight, eps, quantize)
        assert isinstance(x, torch.Tensor)  # (under tensor parallelism nothing is quantized)
        if self.tp.reduce_dtype is None:  # the all-reduce, add and norm in one kernel, or None
            fused = self.tp.linear_all_reduce_add_rms_norm(x, w, residual, norm_weight, eps)
            if fused is not None:
                return fused
            # OPENINFER_TP_SHARES=1: a split-K product's shares go to the push kernel unsummed
            # (it sums them itself: the same bits, one round trip fewer); else the product.
            shares = linear_shares(x, w) if SHARES and isinstance(w, torch.Tensor) else None
            if shares is not None:
                fused = self.tp.all_reduce_add_rms_norm(shares, residual, norm_weight, eps)
                if fused is not None:
                    return fused
                partial = sum_shares(shares, x.dtype)
            else:
                partial = project(x, w)
            fused = self.tp.all_reduce_add_rms_norm(partial, residual, norm_weight, eps)
            if fused is not None:
                return fused
            return fused_add_rms_norm(self.tp.all_reduce(partial), residual, norm_weight, eps)
        return fused_add_rms_norm(self._row_split(x, w), residual, norm_weight, eps)

    def _row_split(self, x: torch.Tensor, w: Linear) -> torch.Tensor:
        """x @ w.T of a layer whose input width is split over the ranks: each rank's partial
        product, summed over the ranks. With `tp.reduce_dtype` (an experiment) the partials
        stay in that dtype until summed, so the sum is rounded once, as on one GPU."""
        assert self.tp is not None
        wide = self.tp.reduce_dtype
        if wide is None:
            return self.tp.all_reduce(project(x, w))
        return self.tp.all_reduce(project_wide(x, w, wide)).to(x.dtype)

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[T, H]: under tensor parallelism each rank looks up the ids of its vocabulary part
        (zero rows for the others) and the sum over ranks is the lookup."""
        if self.tp is None or self.shard is None:
            return embedding(token_ids, self.w.embed)
        return self.tp.all_reduce(embedding_part(token_ids, self.w.embed,
                                                 self.shard.vocab.rows.start))

    def _attention(self, n: int, layer: LayerWeights, x: Activation,
                   batch: ForwardBatch) -> torch.Tensor:
        """The attention heads' output, [T, Hq * D], before o_proj; appends this step's K/V."""
        assert self.kv is not None
        cfg = self.cfg
        t = x.shape[0]
        qkv = project(x, layer.qkv, layer.qkv_bias)
        q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.reshape(t, cfg.num_heads, cfg.head_dim)
        k = k.reshape(t, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(t, cfg.num_kv_heads, cfg.head_dim)
        scales = self._kv_scales[n]
        if self._attend_appended is not None:  # K/V go to the cache in the norm/rotary kernel
            k_scale, v_scale = (None, None) if scales is None else (scales.k, scales.v)
            q = qk_norm_rope_append(q, k, v, layer.q_norm, layer.k_norm, cfg.rms_norm_eps,
                                    batch.positions, self.cos_sin, self.kv.k[n], self.kv.v[n],
                                    batch.slot_mapping, k_scale=k_scale, v_scale=v_scale)
            out = self._attend_appended(q, self.kv.k[n], self.kv.v[n], batch, self.scale,
                                        kv_scales=scales)
        else:
            q, k = qk_norm_rope(q, k, layer.q_norm, layer.k_norm, cfg.rms_norm_eps,
                                batch.positions, self.cos_sin)
            out = self.attention.attend(q, k, v, self.kv.k[n], self.kv.v[n], batch, self.scale,
                                        kv_scales=scales)
        return out.reshape(t, cfg.q_size)
