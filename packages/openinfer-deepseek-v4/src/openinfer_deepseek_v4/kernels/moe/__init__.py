"""Mixture-of-experts routing and experts (DeepSeek-V4). The routing and bf16 experts are
reference ops that run as written on every device; the FP4 experts (`fp4_moe_experts`) run
the reference (dequantize, then `moe_experts_ref`) on CPU and Triton kernels on CUDA: the
decode path (`decode.py`, a matrix-vector product per token and expert) for a few tokens, the
grouped GEMMs (`triton.py`) beyond. `dequant_fp4_ref` dequantizes an FP4 expert weight (the
checkpoint loader's, on CPU)."""

from openinfer_deepseek_v4.kernels.moe.reference import (
    dequant_fp4_ref,
    fp4_moe_experts_ref,
    moe_experts_ref,
    route_hash_ref,
    route_topk_ref,
    swiglu_clamped_ref,
)
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_deepseek_v4.kernels.moe.triton")

fp4_moe_experts = by_device(fp4_moe_experts_ref,
                            _kernels.fp4_moe_experts_triton if _kernels else None)

__all__ = ["dequant_fp4_ref", "fp4_moe_experts", "fp4_moe_experts_ref", "moe_experts_ref",
           "route_hash_ref", "route_topk_ref", "swiglu_clamped_ref"]
