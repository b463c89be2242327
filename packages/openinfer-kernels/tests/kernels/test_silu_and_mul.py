"""silu_and_mul against a float64 oracle that slices the two halves by hand and writes the
sigmoid out as 1 / (1 + exp(-x))."""

from __future__ import annotations

import pytest
import torch

import openinfer_kernels
from openinfer_kernels.activation import silu_and_mul_ref
from openinfer_kernels.activation.triton import silu_and_mul_triton

# The kernel runs compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# fp32: one fp32 sigmoid and two products against float64. bf16: the result is rounded once
# into 8 significant bits (half an ulp is up to 2^-8 relative); allow one ulp, 2^-7.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=2**-6, atol=1e-6)}
# bf16 is rounded twice where transformers rounds twice (before the weight / the product):
# up to two ulps, 2^-6, from the one-rounding float64 oracle.


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


# Kernel vs reference. fp32: exp and the division may differ from torch's in the last ulp or two.
# bf16: both round an fp32 value that may differ in its last bits, so a value on a rounding
# boundary lands one bf16 ulp (2^-7 relative) apart (also the interpreter's truncating cast).
KERNEL_TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6),
              torch.bfloat16: dict(rtol=2**-6, atol=1e-6)}


def check_triton(t: int, inter: int, dtype: torch.dtype, scale: float = 1.0) -> None:
    g = torch.Generator().manual_seed(t * 1000 + inter)
    x = (torch.randn(t, 2 * inter, generator=g) * scale).to(dtype).to(DEVICE)
    x_before = x.clone()
    out = silu_and_mul_triton(x)
    assert out.shape == (t, inter) and out.dtype == dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, silu_and_mul_ref(x), **KERNEL_TOL[dtype])
    assert torch.equal(x, x_before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "inter"), [(1, 1), (1, 60), (63, 24), (3, 2500)],
                         ids=["t1-i1", "t1-i60", "t63-i24", "t3-i2500-ragged-blocks"])
@pytest.mark.parametrize("scale", [1.0, 30.0], ids=["unit", "saturated"])
# e^-gate overflows to inf for gates below about -88 (then gate / inf = -0, as intended): the
# interpreter's numpy says so with a warning, the GPU silently.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_silu_and_mul_triton_matches_reference(t, inter, dtype, scale):
    check_triton(t, inter, dtype, scale)


def test_silu_and_mul_triton_leading_dims_and_empty():
    x = torch.randn(2, 3, 48, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    torch.testing.assert_close(silu_and_mul_triton(x), silu_and_mul_ref(x),
                               **KERNEL_TOL[torch.float32])
    assert silu_and_mul_triton(torch.empty(0, 48, device=DEVICE)).shape == (0, 24)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "inter"), [(4096, 12288), (4096, 9728), (1, 12288)],
                         ids=["8b-prefill", "4b-prefill", "8b-decode"])
def test_silu_and_mul_triton_full_size(t, inter, dtype):
    check_triton(t, inter, dtype)


@pytest.mark.gpu
def test_public_op_on_cuda_is_the_kernel():
    x = torch.randn(63, 2 * 9728, generator=torch.Generator().manual_seed(4)).bfloat16().cuda()
    assert torch.equal(openinfer_kernels.silu_and_mul(x), silu_and_mul_triton(x))
