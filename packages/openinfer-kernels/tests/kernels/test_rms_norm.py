"""rms_norm, fused_add_rms_norm and qk_rms_norm against a float64 oracle: a plain sum over the
row and a division, rather than the reference's mean and rsqrt. (Agreement with transformers'
Qwen3 is the golden gate's job, tests/test_golden_qwen3.py: importing transformers here would
roughly double this suite's CPU runtime.)"""

from __future__ import annotations

import pytest
import torch

import openinfer_kernels
from openinfer_kernels.norm import fused_add_rms_norm_ref, qk_rms_norm_ref, rms_norm_ref

# fp32: the reference and the float64 oracle differ only by fp32 rounding in a D-term sum.
# bf16: the reference rounds its fp32 result once into 8 significant bits (half an ulp is up to
# 2^-8 relative); allow one ulp, 2^-7, for results that sit near a rounding boundary.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=8e-3, atol=1e-6)}

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
