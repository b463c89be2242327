"""The clamped SwiGLU kernel (`kernels/swiglu`) against `swiglu_clamped_ref`: odd widths, both
clamps exercised, no clamp (an infinite limit), a strided input and no rows."""

from __future__ import annotations

import math

import pytest
import torch

from openinfer_deepseek_v4.kernels.swiglu import swiglu_clamped_ref
from openinfer_deepseek_v4.kernels.swiglu.triton import swiglu_clamped_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# bf16: both sides round silu and the product at the same points, but a silu that lands on a
# rounding boundary may go either way (exp's last bit; the interpreter's casts truncate), one
# bf16 ulp of it, which the product carries: one ulp relative plus a small absolute floor.
TOL = {torch.float32: dict(rtol=1e-6, atol=1e-6),
       torch.bfloat16: dict(rtol=2**-7 if DEVICE == "cuda" else 2**-6, atol=2**-8)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("limit", [2.0, math.inf], ids=["clamped", "unclamped"])
@pytest.mark.parametrize(("t", "i"), [(1, 32), (3, 100), (2, 1500)])
def test_matches_reference(t: int, i: int, limit: float, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(t * 7 + i)
    gate_up = (torch.randn(t, 2 * i, generator=g) * 3).to(dtype).to(DEVICE)
    out = swiglu_clamped_triton(gate_up, limit)
    want = swiglu_clamped_ref(gate_up, limit)
    assert out.shape == (t, i) and out.dtype == dtype
    torch.testing.assert_close(out, want, **TOL[dtype])
    if limit < math.inf:
        assert gate_up.abs().max() > limit  # the clamps are exercised


def test_strided_rows_and_no_rows() -> None:
    wide = torch.randn(4, 80, device=DEVICE)
    gate_up = wide[:, :64]  # rows 80 apart
    torch.testing.assert_close(swiglu_clamped_triton(gate_up, 1.0),
                               swiglu_clamped_ref(gate_up, 1.0), **TOL[torch.float32])
    assert swiglu_clamped_triton(torch.zeros((0, 64), device=DEVICE), 1.0).shape == (0, 32)
