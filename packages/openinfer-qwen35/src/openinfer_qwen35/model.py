"""The Qwen3.5 forward pass over a mixed batch of prefill chunks and decode tokens: full
attention layers on paged K/V (the full KV group), Gated DeltaNet layers on one state slot per
request (the state group, `state_cache`)."""

from __future__ import annotations

import torch

from openinfer_core.interfaces.attention import AttentionBackend
from openinfer_core.interfaces.capabilities import supports_cuda_graphs
from openinfer_core.interfaces.kv import KVGroupSpec, KVManager, KVStepLimits
from openinfer_core.interfaces.model import ForwardBatch
from openinfer_kernels import (
    embedding,
    fused_add_rms_norm,
    linear,
    linear_add_rms_norm,
    linear_silu_mul,
    lm_head_logits,
    rms_norm,
    rope_cos_sin,
)
from openinfer_kernels.sampling import SAMPLING_KERNELS
from openinfer_kvcache import GroupedKVManager, KVBuffer, KVCacheSpec, group_pool_blocks
from openinfer_qwen35.config import Qwen35Config
from openinfer_qwen35.mixers import gated_attention, gated_delta_net
from openinfer_qwen35.state_cache import KV_GROUPS, STATE_GROUP, StateCache, StepRows
from openinfer_qwen35.weights import AttentionWeights, Qwen35Weights


class Qwen35Model:
    """Weights, rotary table, K/V buffer and state slots of one Qwen3.5 model on one device.

    Capabilities (core's `interfaces/capabilities.py`): `SupportsKVGroups` (`kv_groups`: the
    full group, then the state group), `SupportsCudaGraphs` for decode steps where the
    attention backend is capturable (a decode step's delta rule and convolution sync nothing
    with the host), `SupportsSamplingKernels`, `SupportsWeightBytes`."""

    def __init__(self, cfg: Qwen35Config, weights: Qwen35Weights, attention: AttentionBackend,
                 *, max_model_len: int, device: torch.device, dtype: torch.dtype) -> None:
        self.cfg = cfg
        self.w = weights
        self.attention = attention
        self.vocab_size = cfg.vocab_size
        self.max_model_len = max_model_len
        self.device = device
        self.dtype = dtype
        self.cos_sin = rope_cos_sin(max_model_len, cfg.rotary_dim, cfg.rope_theta, device)
        # Layer n's index among the layers of its kind: its K/V buffer or its state.
        self._index = [cfg.full_layers.index(n) if n in cfg.full_layers
                       else cfg.linear_layers.index(n) for n in range(cfg.num_layers)]
        self.kv: KVBuffer | None = None
        self.state: StateCache | None = None
        self.cuda_graph_safe = (device.type == "cuda" and supports_cuda_graphs(attention)
                                and attention.cuda_graph_safe)
        self.cuda_graph_max_tokens = 0
        self.sampling_kernels = SAMPLING_KERNELS
        self.weight_bytes = weights.decode_bytes()

    @property
    def kv_groups(self) -> tuple[KVGroupSpec, ...]:
        return KV_GROUPS

    def kv_spec(self, block_size: int) -> KVCacheSpec:
        return KVCacheSpec(len(self.cfg.full_layers), self.cfg.num_kv_heads, self.cfg.head_dim,
                           self.dtype, block_size)

    def kv_bytes_per_block(self, block_size: int) -> int:
        """One block of the full group: every attention layer's K and V."""
        return self.kv_spec(block_size).bytes_per_block

    def kv_window_bytes(self, block_size: int, limits: KVStepLimits) -> int:
        """The state pool's bytes (every pool but the full group's)."""
        slots = group_pool_blocks(self.kv_groups, 0, block_size, limits)[STATE_GROUP]
        return slots * StateCache.bytes_per_slot(self.cfg, self.dtype)

    def create_kv_cache(self, num_blocks: int, block_size: int,
                        limits: KVStepLimits | None = None) -> KVManager:
        pools = group_pool_blocks(self.kv_groups, num_blocks, block_size, limits)
        self.allocate_caches(num_blocks, block_size, pools[STATE_GROUP])
        return GroupedKVManager(self.kv_groups, pools, block_size)

    def allocate_caches(self, num_blocks: int, block_size: int, num_slots: int) -> None:
        """The device buffers alone: `num_blocks` K/V blocks and `num_slots` state slots (block
        0 and slot 0 are padding); replaces any earlier ones."""
        if num_slots < 2:
            raise ValueError(f"a state pool needs at least 2 slots (one is padding), "
                             f"got {num_slots}")
        self.kv = KVBuffer(self.kv_spec(block_size), num_blocks, self.device)
        self.state = StateCache.allocate(self.cfg, num_slots, self.dtype, self.device)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        last = self.forward_hidden(batch)
        out = batch.logits_out
        return lm_head_logits(last, self.w.lm_head, None if out is None else out[:last.shape[0]])

    def forward_hidden(self, batch: ForwardBatch) -> torch.Tensor:
        """The final-normed hidden states at `batch.logits_indices`."""
        if self.kv is None or self.state is None:
            raise RuntimeError("create_kv_cache() must run before forward()")
        cfg, eps = self.cfg, self.cfg.rms_norm_eps
        rows = StepRows.of(batch)
        residual = embedding(batch.input_ids, self.w.embed)
        x = rms_norm(residual, self.w.layers[0].input_norm, eps)
        # The previous layer's MLP activation and down weight: its down projection runs with
        # this layer's add + norm, as each mixer's out-projection runs with the post-mixer
        # one (`linear_add_rms_norm`: a split-K product's shares summed in the norm kernel).
        pending: tuple[torch.Tensor, torch.Tensor] | None = None
        for n, layer in enumerate(self.w.layers):
            if pending is not None:
                x, residual = linear_add_rms_norm(*pending, residual, layer.input_norm, eps)
            i = self._index[n]
            if isinstance(layer.mixer, AttentionWeights):
                mixed = gated_attention(cfg, layer.mixer, x, batch, self.attention,
                                        self.kv.k[i], self.kv.v[i], self.cos_sin)
                out_proj = layer.mixer.o_proj
            else:
                mixed = gated_delta_net(cfg, layer.mixer, x, batch, rows, self.state.conv[i],
                                        self.state.recurrent[i])
                out_proj = layer.mixer.out_proj
            x, residual = linear_add_rms_norm(mixed, out_proj, residual, layer.post_norm, eps)
            pending = (linear_silu_mul(x, layer.gate_up), layer.down)
        assert pending is not None
        mlp_out = linear(*pending)
        # Only rows that sample need the final norm and the vocabulary projection.
        picked = batch.logits_indices
        if batch.max_query_len > 1 or picked.shape[0] != mlp_out.shape[0]:
            mlp_out, residual = mlp_out[picked], residual[picked]
        last, _ = fused_add_rms_norm(mlp_out, residual, self.w.final_norm, eps)
        return last
