"""Mixture-of-experts routing and experts (DeepSeek-V4): the reference ops. No Triton kernel
yet: they run as written on every device."""

from openinfer_kernels.moe.reference import (
    moe_experts_ref,
    route_hash_ref,
    route_topk_ref,
    swiglu_clamped_ref,
)

__all__ = ["moe_experts_ref", "route_hash_ref", "route_topk_ref", "swiglu_clamped_ref"]
