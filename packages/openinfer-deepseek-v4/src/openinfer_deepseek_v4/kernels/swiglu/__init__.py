"""The experts' clamped SwiGLU over a [gate | up] product (DeepSeek-V4):
silu(min(gate, limit)) * clamp(up, -limit, limit). One Triton kernel on CUDA tensors (in place
of four torch ops: the shared expert's activation at decode), the reference
(`kernels/moe/reference.py`) on CPU."""

from openinfer_deepseek_v4.kernels.moe.reference import swiglu_clamped_ref
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_deepseek_v4.kernels.swiglu.triton")

swiglu_clamped = by_device(swiglu_clamped_ref,
                           _kernels.swiglu_clamped_triton if _kernels else None)

__all__ = ["swiglu_clamped", "swiglu_clamped_ref"]
