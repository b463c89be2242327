from openinfer_kernels.activation.reference import silu_and_mul_ref
from openinfer_kernels.dispatch import by_device

silu_and_mul = by_device(silu_and_mul_ref)

__all__ = ["silu_and_mul", "silu_and_mul_ref"]
