# mypy: disable-error-code="no-untyped-def"
"""Gated attention's output gate: the attention output times sigmoid(gate) per channel.
`output_gate_ref` in plain torch (the CPU path and the oracle: torch's two kernels, the
sigmoid rounded to the output's dtype before the product) and `output_gate_triton`, one
launch that reads the gate where the projection left it (a strided view).
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_kernels.pdl import pdl_enter, pdl_launch

BLOCK = 1024


def output_gate_ref(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate), x [T, N] and gate [T, N] of one dtype."""
    return x * torch.sigmoid(gate)


@triton.jit
def _output_gate_kernel(x_ptr, g_ptr, g_row_stride, out_ptr, N, BLOCK: tl.constexpr,
                        PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < N
    x = tl.load(x_ptr + row * N + c, mask=ok, other=0.0)
    g = tl.load(g_ptr + row * g_row_stride + c, mask=ok, other=0.0)
    s = tl.sigmoid(g.to(tl.float32)).to(x.dtype).to(tl.float32)  # rounded as torch's sigmoid
    tl.store(out_ptr + row * N + c, (x.to(tl.float32) * s).to(out_ptr.dtype.element_ty),
             mask=ok)


def output_gate_triton(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """`output_gate_ref` for x [T, N] contiguous and gate [T, N] with dense channels (its rows
    may be strided: a view of the projection's output)."""
    tokens, n = x.shape
    if not x.is_contiguous() or gate.shape != x.shape or gate.stride(1) != 1:
        raise ValueError("output_gate_triton: x [T, N] contiguous, the gate [T, N] with dense "
                         f"channels; got x {tuple(x.shape)}, gate {tuple(gate.shape)} strides "
                         f"{gate.stride()}")
    out = torch.empty_like(x)
    if tokens:
        _output_gate_kernel[(tokens, triton.cdiv(n, BLOCK))](
            x, gate, gate.stride(0), out, n, BLOCK=BLOCK, **pdl_launch(x))
    return out


def output_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """`output_gate_ref`'s result; the Triton kernel on CUDA."""
    if x.is_cuda:
        return output_gate_triton(x.contiguous(), gate)
    return output_gate_ref(x, gate)
