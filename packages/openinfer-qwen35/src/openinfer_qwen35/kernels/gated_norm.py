# mypy: disable-error-code="no-untyped-def"
"""The Gated DeltaNet's output norm: rms_norm(x) * weight * silu(z) per value head.
`gated_rms_norm_ref` in plain torch (the CPU path and the oracle) and `gated_rms_norm_triton`,
one program per (token, head) instead of torch's eight kernels.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


def gated_rms_norm_ref(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> torch.Tensor:
    """rms_norm(x) * weight * silu(gate) over the last dimension; the normed value is
    rounded to x's dtype before the weight, the gate applied in fp32 (transformers'
    order)."""
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * normed * F.silu(gate.float())).to(x.dtype)


@triton.jit
def _gated_norm_kernel(x_ptr, z_ptr, z_row_stride, w_ptr, out_ptr, eps, heads,
                       D: tl.constexpr, BLOCK_D: tl.constexpr, ROUND_PRODUCT: tl.constexpr):
    token_head = tl.program_id(0)
    token = token_head // heads
    head = token_head % heads
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    x = tl.load(x_ptr + token_head * D + d, mask=ok, other=0.0)
    xf = x.to(tl.float32)
    rms = tl.rsqrt(tl.sum(xf * xf) / D + eps)
    normed = (xf * rms).to(x.dtype).to(tl.float32)
    product = tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32) * normed
    if ROUND_PRODUCT:  # weight and x of one low-precision dtype: torch rounds their product
        product = product.to(x.dtype).to(tl.float32)
    z = tl.load(z_ptr + token * z_row_stride + head * D + d, mask=ok, other=0.0)
    z = z.to(tl.float32)
    y = product * (z * tl.sigmoid(z))
    tl.store(out_ptr + token_head * D + d, y.to(out_ptr.dtype.element_ty), mask=ok)


def gated_rms_norm_triton(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                          eps: float) -> torch.Tensor:
    """`gated_rms_norm_ref` for x [T, H, D] contiguous and gate [T, H, D] whose heads and
    channels are dense (its tokens may be strided: a view of a projection's output)."""
    tokens, heads, dim = x.shape
    if (not x.is_contiguous() or gate.stride(2) != 1 or gate.stride(1) != dim
            or weight.dtype not in (x.dtype, torch.float32)):
        raise ValueError("gated_rms_norm_triton: x contiguous, the gate's heads dense, the "
                         "weight in x's dtype or fp32")
    out = torch.empty_like(x)
    if tokens:
        _gated_norm_kernel[(tokens * heads,)](
            x, gate, gate.stride(0), weight, out, eps, heads, D=dim,
            BLOCK_D=triton.next_power_of_2(dim),
            ROUND_PRODUCT=weight.dtype != torch.float32 and x.dtype != torch.float32)
    return out


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """`gated_rms_norm_ref`'s result; the Triton kernel on CUDA."""
    if x.is_cuda:
        return gated_rms_norm_triton(x.contiguous(), gate, weight, eps)
    return gated_rms_norm_ref(x, gate, weight, eps)
