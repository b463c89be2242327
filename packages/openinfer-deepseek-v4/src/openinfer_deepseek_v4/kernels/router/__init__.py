"""The MoE router after its logits (DeepSeek-V4): scores sqrt(softplus(logits)) in fp32, the
experts picked by the biased top-k (`route_topk`) or looked up by token id in the hash layers
(`route_hash`), each weighted by its score over the picked scores' sum times a scale. One
Triton kernel per step on CUDA tensors (in place of a dozen torch ops), the references
(`kernels/moe/reference.py`, the model reference's own) on CPU. `route_fused`: the router's
logits and the routing in one launch (`fused.py`), where a decode step's few tokens take the
small-batch linear's split-K tile for the router weight."""

from __future__ import annotations

import os

import torch

from openinfer_deepseek_v4.kernels.moe.reference import route_hash_ref, route_topk_ref
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_deepseek_v4.kernels.router.triton")
_fused = triton_kernels("openinfer_deepseek_v4.kernels.router.fused")
# OPENINFER_DSV4_FUSED_ROUTER=0: the product and the routing apart (an A/B); read at import
FUSED_ROUTER = os.environ.get("OPENINFER_DSV4_FUSED_ROUTER", "1") != "0"

route_topk = by_device(route_topk_ref, _kernels.route_topk_triton if _kernels else None)
route_hash = by_device(route_hash_ref, _kernels.route_hash_triton if _kernels else None)


def route_fused(x: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor | None,
                table: torch.Tensor | None, token_ids: torch.Tensor, top_k: int,
                scale: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`route_topk(linear(x, gate), bias, top_k, scale)` (no `table`) or `route_hash(linear(x,
    gate), table, token_ids, scale)` in one launch, where it takes these rows (CUDA, a plain
    router weight with a split-K small-batch tile for them); None, nothing done, elsewhere."""
    if (_fused is None or not FUSED_ROUTER or not x.is_cuda or x.dim() != 2
            or (table is None and bias is None)):
        return None
    from openinfer_kernels.gemm import small_batch_tile

    tile = small_batch_tile(x, gate)
    if tile is None:
        return None
    return _fused.route_fused_triton(x, gate, tile, bias, table, token_ids, top_k, scale)


__all__ = ["route_fused", "route_hash", "route_hash_ref", "route_topk", "route_topk_ref"]
