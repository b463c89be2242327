"""silu_and_mul against a float64 oracle that slices the two halves by hand and writes the
sigmoid out as 1 / (1 + exp(-x))."""

from __future__ import annotations

import pytest
import torch

import openinfer_kernels
from openinfer_kernels.activation import silu_and_mul_ref

# fp32: one fp32 sigmoid and two products against float64. bf16: the result is rounded once
# into 8 significant bits (half an ulp is up to 2^-8 relative); allow one ulp, 2^-7.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=8e-3, atol=1e-6)}


def oracle(x: torch.Tensor) -> torch.Tensor:
    inter = x.shape[-1] // 2
    gate, up = x[:, :inter].double(), x[:, inter:].double()
    return gate * (1.0 / (1.0 + torch.exp(-gate))) * up


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "inter"), [(1, 1), (1, 60), (63, 24), (5, 128)],
                         ids=["t1-i1", "t1-i60", "t63-i24", "t5-i128"])
@pytest.mark.parametrize("scale", [1.0, 30.0], ids=["unit", "saturated"])
def test_silu_and_mul_matches_oracle(t, inter, dtype, scale):
    # scale 30 drives gates deep into both tails: silu -> 0 below, silu -> identity above.
    g = torch.Generator().manual_seed(t * 1000 + inter)
    x = (torch.randn(t, 2 * inter, generator=g) * scale).to(dtype)
    x_before = x.clone()
    out = silu_and_mul_ref(x)
    assert out.shape == (t, inter) and out.dtype == dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), oracle(x), **TOL[dtype])
    assert torch.equal(x, x_before)


def test_gate_is_the_first_half():
    # gate = [0, 100], up = [5, 7]: silu(0) = 0 kills the first, silu(100) ~ 100 keeps the second.
    out = silu_and_mul_ref(torch.tensor([[0.0, 100.0, 5.0, 7.0]]))
    torch.testing.assert_close(out, torch.tensor([[0.0, 700.0]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_public_op_on_cpu_is_the_reference(dtype):
    x = torch.randn(63, 120, generator=torch.Generator().manual_seed(9)).to(dtype)
    assert torch.equal(openinfer_kernels.silu_and_mul(x), silu_and_mul_ref(x))
