"""rope_cos_sin and rotary_embedding against a float64 complex-number rotation in Qwen3's
(GPT-NeoX) pairing, i with i + D/2. (Agreement with transformers' Qwen3 is the golden gate's
job, tests/test_golden_qwen3.py: importing transformers here would roughly double this
suite's CPU runtime.)"""

from __future__ import annotations

import pytest
import torch

import openinfer_kernels
from openinfer_kernels.rotary import rope_cos_sin, rotary_embedding_ref

THETA = 1_000_000.0  # Qwen3's rope_theta
MAX_POSITIONS = 256

# fp32: the table's angles are fp32 products position * inv_freq, off by up to ~1 ulp of an
# angle below MAX_POSITIONS (~1.5e-5 rad), so a rotated value (|x| up to ~4) may be off ~1e-4
# from the float64 oracle. bf16: the result is rounded once into 8 significant bits
# (2^-8 relative); allow one ulp, plus the fp32 angle error near zero.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-4), torch.bfloat16: dict(rtol=2**-6, atol=2**-7)}
# bf16: cos and sin are applied in bf16 as transformers does (2^-9 relative each), then the
# output is rounded: two ulps relative, plus 2^-7 absolute near zero crossings.

POSITIONS = {
    "t1-pos0": [0],
    "t1-pos200": [200],
    "scattered": [0, 5, 3, 17, 17, 255, 1, 128],  # unsorted, repeated, both table ends
    "t63-chunk-at-100": list(range(100, 163)),
}
HEADS = [(5, 1, 60), (4, 2, 24), (3, 3, 128)]
HEAD_IDS = ["gqa5-1-d60", "gqa4-2-d24", "mha3-d128"]


def rotate_complex(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Pair (i, i + D/2) as the complex number x_i + j*x_{i+D/2}, times e^{j*pos*theta^(-2i/D)}."""
    d = x.shape[-1]
    half = d // 2
    x64 = x.double()
    pairs = torch.complex(x64[..., :half], x64[..., half:])
    freqs = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / d)
    angles = positions.double()[:, None] * freqs[None, :]  # [T, D/2]
    rotated = pairs * torch.polar(torch.ones_like(angles), angles)[:, None, :]
    return torch.cat([rotated.real, rotated.imag], dim=-1)


def make_qk(t: int, hq: int, hk: int, d: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(t, hq, d, generator=g), torch.randn(t, hk, d, generator=g)
    return q.to(dtype), k.to(dtype)


@pytest.mark.parametrize("d", [24, 60, 128])
def test_cos_sin_table(d):
    table = rope_cos_sin(MAX_POSITIONS, d, THETA)
    assert table.shape == (MAX_POSITIONS, d) and table.dtype == torch.float32
    half = d // 2
    pos = torch.arange(MAX_POSITIONS, dtype=torch.float64)[:, None]
    angles = pos * THETA ** (-torch.arange(half, dtype=torch.float64) * 2 / d)[None, :]
    torch.testing.assert_close(table[:, :half].double(), angles.cos(), rtol=0, atol=1e-4)
    torch.testing.assert_close(table[:, half:].double(), angles.sin(), rtol=0, atol=1e-4)
    assert torch.equal(table[0], torch.cat([torch.ones(half), torch.zeros(half)]))


def test_cos_sin_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="even"):
        rope_cos_sin(8, 63, THETA)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("hq", "hk", "d"), HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("case", list(POSITIONS))
def test_rotary_matches_complex_rotation(case, hq, hk, d, dtype):
    positions = torch.tensor(POSITIONS[case])
    q, k = make_qk(len(positions), hq, hk, d, dtype)
    cos_sin = rope_cos_sin(MAX_POSITIONS, d, THETA)
    q_out, k_out = rotary_embedding_ref(q, k, positions, cos_sin)
    assert q_out.shape == q.shape and q_out.dtype == dtype
    assert k_out.shape == k.shape and k_out.dtype == dtype
    torch.testing.assert_close(q_out.double(), rotate_complex(q, positions, THETA), **TOL[dtype])
    torch.testing.assert_close(k_out.double(), rotate_complex(k, positions, THETA), **TOL[dtype])


def test_position_zero_is_identity():
    q, k = make_qk(3, 4, 2, 24, torch.float32)
    q_out, k_out = rotary_embedding_ref(q, k, torch.zeros(3, dtype=torch.int64),
                                        rope_cos_sin(8, 24, THETA))
    assert torch.equal(q_out, q) and torch.equal(k_out, k)


def test_scores_depend_only_on_relative_position():
    # The property attention relies on: <rot(q, m), rot(k, n)> is a function of m - n.
    q, k = make_qk(1, 1, 1, 60, torch.float32, seed=1)
    cos_sin = rope_cos_sin(MAX_POSITIONS, 60, THETA)
    scores = []
    for shift in (0, 37, 150):
        pos = torch.tensor([20 + shift])
        q_rot, _ = rotary_embedding_ref(q, k, pos, cos_sin)
        _, k_rot = rotary_embedding_ref(q, k, pos - 13, cos_sin)
        scores.append(float((q_rot * k_rot).sum()))
    assert scores == pytest.approx([scores[0]] * 3, abs=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_public_op_on_cpu_is_the_reference(dtype):
    positions = torch.tensor(POSITIONS["scattered"])
    q, k = make_qk(len(positions), 5, 1, 60, dtype, seed=3)
    cos_sin = rope_cos_sin(MAX_POSITIONS, 60, THETA)
    assert openinfer_kernels.rope_cos_sin is rope_cos_sin
    for got, want in zip(openinfer_kernels.rotary_embedding(q, k, positions, cos_sin),
                         rotary_embedding_ref(q, k, positions, cos_sin), strict=True):
        assert torch.equal(got, want)
