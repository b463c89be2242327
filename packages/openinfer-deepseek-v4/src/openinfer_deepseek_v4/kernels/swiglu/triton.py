# mypy: disable-error-code="no-untyped-def"
"""`swiglu_clamped_ref` in one launch, rounded where torch rounds it: openinfer-kernels'
`silu_mul` with its limit (the clamps exact, silu computed in fp32 and rounded to the output's
dtype, then the product of the two rounded factors in fp32 rounded once more: what torch's silu
and mul do in bf16), so the result equals the reference's but for exp's last fp32 bit.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_kernels.activation.triton import silu_mul
from openinfer_kernels.pdl import pdl_enter, pdl_launch

BLOCK = 1024


@triton.jit
def _swiglu_kernel(x_ptr, out_ptr, N, stride_x, stride_o, LIMIT: tl.constexpr,
                   BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = rn < N
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * stride_x + rn, mask=ok, other=0.0)
    up = tl.load(x_ptr + row * stride_x + N + rn, mask=ok, other=0.0)
    tl.store(out_ptr + row * stride_o + rn, silu_mul(gate, up, dtype, LIMIT).to(dtype), mask=ok)


def swiglu_clamped_triton(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    """gate_up [T, 2I] (rows contiguous) -> [T, I] in its dtype."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"swiglu_clamped: gate_up must be [T, 2I], got {tuple(gate_up.shape)}")
    if gate_up.stride(1) != 1:
        gate_up = gate_up.contiguous()
    t, n = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((t, n), dtype=gate_up.dtype, device=gate_up.device)
    if t:
        block = min(BLOCK, triton.next_power_of_2(n))
        clamp = float(limit) if 0 < limit < float("inf") else 0.0  # silu_mul's "no limit"
        _swiglu_kernel[(t, triton.cdiv(n, block))](gate_up, out, n, gate_up.stride(0),
                                                   out.stride(0), LIMIT=clamp, BLOCK_N=block,
                                                   **pdl_launch(gate_up))
    return out
