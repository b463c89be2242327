"""The DeepSeek-V4 forward pass over a mixed batch of prefill chunks and decode tokens on the
paged cache of `kv_cache`: `reference.forward` with `paged_attention` in place of the
whole-sequence attention, batched over the step's requests. Its ops are openinfer-kernels'
(Triton on the GPU, their plain-torch references on CPU); the weights stay in FP8/FP4 on the
GPU (`quantized.py`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from openinfer_core.interfaces.kv import KVManager
from openinfer_core.interfaces.model import ForwardBatch
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.kv_cache import LayerCache, allocate_layers, kv_bytes_per_block
from openinfer_deepseek_v4.paged_attention import paged_attention
from openinfer_deepseek_v4.reference import (
    HyperConnectionWeights,
    ModelWeights,
    embed_streams,
    logits,
    moe,
)
from openinfer_kernels.mhc import hc_head, hc_post, hc_pre
from openinfer_kvcache import PagedKVManager


class DeepseekV4Model:
    """Weights and paged cache of one DeepSeek-V4 model on one device."""

    def __init__(self, cfg: DeepseekV4Config, weights: ModelWeights, *, max_model_len: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.cfg = cfg
        self.w = weights
        self.vocab_size = cfg.vocab_size
        self.max_model_len = max_model_len
        self.device = device
        self.dtype = dtype
        self.layers: list[LayerCache] | None = None

    def kv_bytes_per_block(self, block_size: int) -> int:
        return kv_bytes_per_block(self.cfg, block_size, self.dtype)

    def create_kv_cache(self, num_blocks: int, block_size: int) -> KVManager:
        if num_blocks < 2:
            raise ValueError(f"a KV cache needs at least 2 blocks (one is padding), "
                             f"got {num_blocks}")
        self.layers = allocate_layers(self.cfg, num_blocks, block_size, self.dtype, self.device)
        return PagedKVManager(num_blocks, block_size)

    def kv_block_tensors(self) -> list[torch.Tensor]:
        """Layer-major: each layer's raw entries, then its compressors' projections and
        entries."""
        if self.layers is None:
            raise RuntimeError("create_kv_cache() must run before kv_block_tensors()")
        return [t for layer in self.layers for t in layer.tensors()]

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if self.layers is None:
            raise RuntimeError("create_kv_cache() must run before forward()")
        cfg = self.cfg
        streams = embed_streams(batch.input_ids, self.w, cfg)
        for i, (layer, cache) in enumerate(zip(self.w.layers, self.layers, strict=True)):
            streams = _around(streams, layer.attn_hc, layer.attn_norm,
                              partial(paged_attention, w=layer.attention, cfg=cfg, layer=i,
                                      cache=cache, batch=batch), cfg)
            streams = _around(streams, layer.ffn_hc, layer.ffn_norm,
                              partial(moe, token_ids=batch.input_ids, w=layer.moe, cfg=cfg), cfg)
        # Only the rows that sample need the head.
        rows = streams[batch.logits_indices]
        w = self.w.hc_head
        collapsed = hc_head(rows, w.fn, w.base, w.scale, hc_eps=cfg.hc_eps,
                            norm_eps=cfg.rms_norm_eps)
        return logits(collapsed, self.w, cfg)


def _around(streams: torch.Tensor, hc: HyperConnectionWeights, norm: torch.Tensor,
            sublayer: Callable[[torch.Tensor], torch.Tensor],
            cfg: DeepseekV4Config) -> torch.Tensor:
    """`reference.around` in two ops (Triton kernels on the GPU): the mixing weights, collapse
    and norm before the sublayer, the expansion after."""
    x, post, comb = hc_pre(streams, hc.fn, hc.base, hc.scale, norm, hc_eps=cfg.hc_eps,
                           norm_eps=cfg.rms_norm_eps, sinkhorn_iters=cfg.hc_sinkhorn_iters)
    return hc_post(streams, sublayer(x), post, comb)
