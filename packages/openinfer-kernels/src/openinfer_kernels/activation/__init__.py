from openinfer_kernels.activation.reference import silu_and_mul_ref
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_kernels.activation.triton")

silu_and_mul = by_device(silu_and_mul_ref, _kernels.silu_and_mul_triton if _kernels else None)

__all__ = ["silu_and_mul", "silu_and_mul_ref"]
