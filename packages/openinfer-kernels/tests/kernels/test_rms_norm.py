"""rms_norm, fused_add_rms_norm and qk_rms_norm against a float64 oracle: a plain sum over the
row and a division, rather than the reference's mean and rsqrt. (Agreement with transformers'
Qwen3 is the golden gate's job, tests/test_golden_qwen3.py: importing transformers here would
roughly double this suite's CPU runtime.)"""

from __future__ import annotations

import pytest
import torch

import openinfer_kernels
from openinfer_kernels.norm import fused_add_rms_norm_ref, qk_rms_norm_ref, rms_norm_ref
from openinfer_kernels.norm.triton import (
    fused_add_rms_norm_triton,
    qk_rms_norm_triton,
    rms_norm_triton,
)

# The kernels run compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# fp32: the reference and the float64 oracle differ only by fp32 rounding in a D-term sum.
# bf16: the reference rounds its fp32 result once into 8 significant bits (half an ulp is up to
# 2^-8 relative); allow one ulp, 2^-7, for results that sit near a rounding boundary.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=2**-6, atol=1e-6)}
# bf16 is rounded twice where transformers rounds twice (before the weight / the product):
# up to two ulps, 2^-6, from the one-rounding float64 oracle.

SHAPES = [(1, 60), (63, 24), (7, 128), (5, 3, 24)]  # last one: [T, H, D], normed over D


def oracle(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x64, w64 = x.double(), weight.double()
    d = x64.shape[-1]
    rms = torch.sqrt((x64 * x64).sum(dim=-1, keepdim=True) / d + eps)
    return x64 / rms * w64


def make(shape: tuple[int, ...], dtype: torch.dtype, scale: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * scale).to(dtype)
    weight = (1 + 0.5 * torch.randn(shape[-1], generator=g)).to(dtype)
    return x, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("scale", [1.0, 1e-3], ids=["unit", "tiny-eps-matters"])
def test_rms_norm_matches_oracle(shape, dtype, scale):
    eps = 1e-6
    x, weight = make(shape, dtype, scale)
    out = rms_norm_ref(x, weight, eps)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out.double(), oracle(x, weight, eps), **TOL[dtype])


def test_eps_is_inside_the_square_root():
    # All-zero rows must give zeros, not NaN; a constant row c gives c / sqrt(c^2 + eps).
    weight = torch.ones(4)
    assert torch.equal(rms_norm_ref(torch.zeros(2, 4), weight, 1e-6), torch.zeros(2, 4))
    c, eps = 0.01, 1e-4
    out = rms_norm_ref(torch.full((1, 4), c), weight, eps)
    torch.testing.assert_close(out, torch.full((1, 4), c / (c * c + eps) ** 0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 60), (63, 24)], ids=str)
def test_fused_add_rms_norm(shape, dtype):
    eps = 1e-6
    x, weight = make(shape, dtype, 1.0, seed=1)
    residual, _ = make(shape, dtype, 1.0, seed=2)
    x_before, residual_before = x.clone(), residual.clone()

    normed, summed = fused_add_rms_norm_ref(x, residual, weight, eps)

    # The new residual stream is x + residual rounded once into the input dtype...
    assert summed.dtype == dtype and normed.dtype == dtype
    assert torch.equal(summed, (x.double() + residual.double()).to(dtype))
    # ...and the normed output is the norm of that rounded stream, as the next layer will see it.
    torch.testing.assert_close(normed.double(), oracle(summed, weight, eps), **TOL[dtype])
    # Out-of-place: a fused kernel may update in place, but the reference spec does not.
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("hq", "hk", "d"), [(5, 1, 60), (4, 2, 24), (3, 3, 128)],
                         ids=["gqa5-1-d60", "gqa4-2-d24", "mha3-d128"])
@pytest.mark.parametrize("t", [1, 63])
def test_qk_rms_norm_is_per_head(t, hq, hk, d, dtype):
    eps = 1e-6
    q, q_weight = make((t, hq, d), dtype, 1.0, seed=4)
    k, k_weight = make((t, hk, d), dtype, 1.0, seed=5)
    q_out, k_out = qk_rms_norm_ref(q, k, q_weight, k_weight, eps)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    torch.testing.assert_close(q_out.double(), oracle(q, q_weight, eps), **TOL[dtype])
    torch.testing.assert_close(k_out.double(), oracle(k, k_weight, eps), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_public_ops_on_cpu_are_the_reference(dtype):
    x, weight = make((63, 60), dtype, 1.0, seed=6)
    residual, _ = make((63, 60), dtype, 1.0, seed=7)
    assert torch.equal(openinfer_kernels.rms_norm(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6))
    for got, want in zip(openinfer_kernels.fused_add_rms_norm(x, residual, weight, 1e-6),
                         fused_add_rms_norm_ref(x, residual, weight, 1e-6), strict=True):
        assert torch.equal(got, want)
    q, k = x.view(63, 5, 12), x.view(63, 5, 12)[:, :1]
    qw, kw = weight[:12], weight[12:24]
    for got, want in zip(openinfer_kernels.qk_rms_norm(q, k, qw, kw, 1e-6),
                         qk_rms_norm_ref(q, k, qw, kw, 1e-6), strict=True):
        assert torch.equal(got, want)


# Kernel vs reference. fp32: the same fp32 math, summed over the row in another order (a few ulp).
# bf16: both round an fp32 result that may differ in its last fp32 bits, so a value on a rounding
# boundary may land one bf16 ulp (2^-7 relative) apart.
KERNEL_TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5),
              torch.bfloat16: dict(rtol=2**-6, atol=1e-5)}


def assert_rounded_alike(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit for bit, except that the Triton interpreter casts fp32 -> bf16 by truncation where the
    GPU (and torch) round to nearest even: there, one bf16 ulp (2^-7 relative) apart at most."""
    if got.is_cuda or got.dtype != torch.bfloat16:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=2**-7, atol=0)


ROW_SHAPES = [(1, 60), (63, 24), (3, 2560), (2, 3, 24)]
GPU_ROW_SHAPES = [(4096, 4096), (4096, 2560), (1024, 5120), (64, 8192)]


def check_rms_norm_triton(shape, dtype, scale=1.0):
    x, weight = (a.to(DEVICE) for a in make(shape, dtype, scale, seed=10))
    out = rms_norm_triton(x, weight, 1e-6)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out, rms_norm_ref(x, weight, 1e-6), **KERNEL_TOL[dtype])


def check_fused_add_triton(shape, dtype):
    x, weight = (a.to(DEVICE) for a in make(shape, dtype, 1.0, seed=11))
    residual = make(shape, dtype, 1.0, seed=12)[0].to(DEVICE)
    x_before, residual_before = x.clone(), residual.clone()
    normed, summed = fused_add_rms_norm_triton(x, residual, weight, 1e-6)
    assert_rounded_alike(summed, fused_add_rms_norm_ref(x, residual, weight, 1e-6)[1])
    # The norm of the stream as stored (the reference's, on a GPU where the streams are equal).
    torch.testing.assert_close(normed, rms_norm_ref(summed, weight, 1e-6), **KERNEL_TOL[dtype])
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", ROW_SHAPES, ids=str)
@pytest.mark.parametrize("scale", [1.0, 1e-3], ids=["unit", "tiny-eps-matters"])
def test_rms_norm_triton_matches_reference(shape, dtype, scale):
    check_rms_norm_triton(shape, dtype, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", ROW_SHAPES, ids=str)
def test_fused_add_rms_norm_triton_matches_reference(shape, dtype):
    check_fused_add_triton(shape, dtype)


def test_rms_norm_triton_zero_rows_and_strided_rows():
    weight = torch.ones(24, device=DEVICE)
    zeros = torch.zeros(2, 24, device=DEVICE)
    assert torch.equal(rms_norm_triton(zeros, weight, 1e-6), zeros)
    assert rms_norm_triton(torch.empty(0, 24, device=DEVICE), weight, 1e-6).shape == (0, 24)
    wide = torch.randn(5, 40, generator=torch.Generator().manual_seed(13)).to(DEVICE)
    x = wide[:, 8:32]  # rows 40 apart
    torch.testing.assert_close(rms_norm_triton(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6),
                               **KERNEL_TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "hq", "hk", "d"), [(1, 5, 1, 60), (63, 4, 2, 24), (2, 32, 8, 128)],
                         ids=["t1-gqa5-1-d60", "t63-gqa4-2-d24", "t2-gqa32-8-d128"])
def test_qk_rms_norm_triton_on_fused_qkv_views(t, hq, hk, d, dtype):
    qkv = make((t, (hq + 2 * hk) * d), dtype, 1.0, seed=14)[0].to(DEVICE)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)
    q_weight, k_weight = (make((d,), dtype, 1.0, seed=s)[1].to(DEVICE) for s in (15, 16))
    got = qk_rms_norm_triton(q, k, q_weight, k_weight, 1e-6)
    want = qk_rms_norm_ref(q, k, q_weight, k_weight, 1e-6)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == dtype
        torch.testing.assert_close(g, w, **KERNEL_TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", GPU_ROW_SHAPES, ids=str)
def test_norm_triton_full_size(shape, dtype):
    check_rms_norm_triton(shape, dtype)
    check_fused_add_triton(shape, dtype)


@pytest.mark.gpu
def test_public_ops_on_cuda_are_the_kernels():
    x, weight = (a.cuda() for a in make((63, 2560), torch.bfloat16, 1.0, seed=17))
    assert torch.equal(openinfer_kernels.rms_norm(x, weight, 1e-6),
                       rms_norm_triton(x, weight, 1e-6))
    for got, want in zip(openinfer_kernels.fused_add_rms_norm(x, x, weight, 1e-6),
                         fused_add_rms_norm_triton(x, x, weight, 1e-6), strict=True):
        assert torch.equal(got, want)
