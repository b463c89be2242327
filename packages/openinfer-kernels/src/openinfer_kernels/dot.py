# mypy: disable-error-code="no-untyped-def"
"""`dot`: Triton's `tl.dot`, exact under the interpreter too, and `dot_options`, the launch
arguments it takes. Every bf16 tensor-core product of the kernels here and in the model lines'
own kernels goes through it, so CPU tests under TRITON_INTERPRET=1 check the same math the GPU
runs. (DeepSeek-V4's mHC mix calls `tl.dot` itself: its operands are fp32 only, which the
interpreter multiplies correctly, at "tf32x3" on the GPU.)
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """tl.dot, except under the interpreter (UPCAST), whose tl.dot multiplies bf16 bit patterns
    as integers (triton 3.9): there the operands go to fp32 first, which is exact, so the
    result matches the tensor cores' bf16 x bf16 -> fp32 product."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


def dot_options(x: torch.Tensor) -> dict[str, object]:
    """`dot`'s PRECISION and UPCAST for a kernel whose products take `x`'s dtype, launched on
    `x`'s device: fp32 multiplies in full fp32 ("ieee"; tf32 would cost ~1e-3 relative), other
    dtypes ignore the setting; a device other than CUDA means the interpreter."""
    return {"PRECISION": "ieee" if x.dtype == torch.float32 else "tf32",
            "UPCAST": x.device.type != "cuda"}
