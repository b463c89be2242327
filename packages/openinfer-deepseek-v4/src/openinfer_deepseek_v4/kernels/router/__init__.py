"""The MoE router after its logits (DeepSeek-V4): scores sqrt(softplus(logits)) in fp32, the
experts picked by the biased top-k (`route_topk`) or looked up by token id in the hash layers
(`route_hash`), each weighted by its score over the picked scores' sum times a scale. One
Triton kernel per step on CUDA tensors (in place of a dozen torch ops), the references
(`kernels/moe/reference.py`, the model reference's own) on CPU."""

from openinfer_deepseek_v4.kernels.moe.reference import route_hash_ref, route_topk_ref
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_deepseek_v4.kernels.router.triton")

route_topk = by_device(route_topk_ref, _kernels.route_topk_triton if _kernels else None)
route_hash = by_device(route_hash_ref, _kernels.route_hash_triton if _kernels else None)

__all__ = ["route_hash", "route_hash_ref", "route_topk", "route_topk_ref"]
