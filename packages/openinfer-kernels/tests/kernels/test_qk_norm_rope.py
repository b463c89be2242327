"""qk_norm_rope: the fused kernel against its reference (qk_rms_norm then rotary_embedding), on q/k
as the model hands them over: column slices of one fused qkv projection, viewed as heads."""

from __future__ import annotations

import pytest
import torch

import openinfer_kernels
from openinfer_kernels.rotary import qk_norm_rope_append_ref, qk_norm_rope_ref, rope_cos_sin
from openinfer_kernels.rotary.triton import (
    heads_per_program,
    qk_norm_rope_append_triton,
    qk_norm_rope_triton,
)

# The kernel runs compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
THETA, MAX_POSITIONS, EPS = 1_000_000.0, 256, 1e-6

# Against the reference. fp32: the same fp32 math in another summation order. bf16: both round
# at the same points (normalised value, normed head, cos/sin, output), but the interpreter's
# casts truncate where torch rounds to nearest, so an intermediate (|n| < 8 here) may sit one
# ulp (<= 2^-5) apart: 2^-5 absolute, plus one ulp of final rounding.
REF_TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2**-7, atol=2**-5)}
if DEVICE == "cpu":  # four truncating casts in a row can put the interpreter 3 ulps (3 * 2^-5) off
    REF_TOL[torch.bfloat16] = dict(rtol=2**-5, atol=2**-3)

# (T, Hq, Hk, D, q/k as strided views of a fused qkv output, or contiguous)
CASES = {
    "t1-gqa5-1-d64-qkv": (1, 5, 1, 64, True),
    "t63-gqa5-1-d24-qkv": (63, 5, 1, 24, True),
    "t3-gqa32-8-d128-qkv": (3, 32, 8, 128, True),
    "t7-gqa4-2-d128-contiguous": (7, 4, 2, 128, False),
}


def make(t: int, hq: int, hk: int, d: int, dtype: torch.dtype, fused_qkv: bool, seed: int = 0):
    """q, k, their norm weights, positions (both table ends included) and the cos/sin table."""
    g = torch.Generator().manual_seed(seed)
    if fused_qkv:  # q and k are strided views: rows (hq + 2 hk) * d apart
        qkv = torch.randn(t, (hq + 2 * hk) * d, generator=g).to(dtype)
        q = qkv[:, : hq * d].view(t, hq, d)
        k = qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)
    else:
        q = torch.randn(t, hq, d, generator=g).to(dtype)
        k = torch.randn(t, hk, d, generator=g).to(dtype)
    q_weight = (1 + 0.5 * torch.randn(d, generator=g)).to(dtype)
    k_weight = (1 + 0.5 * torch.randn(d, generator=g)).to(dtype)
    positions = torch.randint(0, MAX_POSITIONS, (t,), generator=g)
    positions[0] = MAX_POSITIONS - 1
    if t > 1:
        positions[-1] = 0
    cos_sin = rope_cos_sin(MAX_POSITIONS, d, THETA)
    return tuple(a.to(DEVICE) for a in (q, k, q_weight, k_weight, positions, cos_sin))


def check(t, hq, hk, d, dtype, fused_qkv, heads=None):
    q, k, q_weight, k_weight, positions, cos_sin = make(t, hq, hk, d, dtype, fused_qkv)
    q_before, k_before = q.clone(), k.clone()
    got = qk_norm_rope_triton(q, k, q_weight, k_weight, EPS, positions, cos_sin, heads=heads)
    want = qk_norm_rope_ref(q, k, q_weight, k_weight, EPS, positions, cos_sin)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == dtype and g.is_contiguous()
        torch.testing.assert_close(g, w, **REF_TOL[dtype])
    assert torch.equal(q, q_before) and torch.equal(k, k_before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_qk_norm_rope_triton_matches_reference(case, dtype):
    check(*CASES[case][:4], dtype, fused_qkv=CASES[case][4])


# Several heads a program (prefill steps), the last tile of q or k part-empty where the head
# count does not divide.
@pytest.mark.parametrize("heads", [2, 4, 8])
@pytest.mark.parametrize("case", ["t63-gqa5-1-d24-qkv", "t3-gqa32-8-d128-qkv",
                                  "t7-gqa4-2-d128-contiguous"])
def test_head_tiles_match_reference(case, heads):
    check(*CASES[case][:4], torch.float32, fused_qkv=CASES[case][4], heads=heads)
    check_append(*CASES[case][:4], torch.float32, fused_qkv=CASES[case][4], heads=heads)


def test_heads_per_program():
    assert heads_per_program(1, 32) == 1 and heads_per_program(63, 32) == 1
    assert heads_per_program(2048, 32) == 8 and heads_per_program(2048, 5) == 8
    assert heads_per_program(64, 2) == 2


def test_position_zero_is_plain_qk_norm():
    q, k, q_weight, k_weight, _, cos_sin = make(5, 4, 2, 24, torch.float32, fused_qkv=True)
    zeros = torch.zeros(5, dtype=torch.int64, device=DEVICE)
    q_out, k_out = qk_norm_rope_triton(q, k, q_weight, k_weight, EPS, zeros, cos_sin)
    q_norm, k_norm = openinfer_kernels.qk_rms_norm(q.cpu(), k.cpu(), q_weight.cpu(),
                                                   k_weight.cpu(), EPS)
    torch.testing.assert_close(q_out.cpu(), q_norm, **REF_TOL[torch.float32])
    torch.testing.assert_close(k_out.cpu(), k_norm, **REF_TOL[torch.float32])


def test_rejects_odd_head_dim():
    q, k = torch.zeros(2, 2, 7), torch.zeros(2, 1, 7)
    with pytest.raises(ValueError, match="even"):
        qk_norm_rope_triton(q, k, torch.ones(7), torch.ones(7), EPS,
                            torch.zeros(2, dtype=torch.int64), torch.zeros(8, 7))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_public_op_on_cpu_is_the_reference(dtype):
    args = [a.cpu() for a in make(63, 5, 1, 24, dtype, fused_qkv=True)]
    q, k, q_weight, k_weight, positions, cos_sin = args
    for got, want in zip(openinfer_kernels.qk_norm_rope(q, k, q_weight, k_weight, EPS, positions,
                                                        cos_sin),
                         qk_norm_rope_ref(q, k, q_weight, k_weight, EPS, positions, cos_sin),
                         strict=True):
        assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "hq", "hk"), [(4096, 32, 8), (1, 32, 8), (2048, 64, 8)],
                         ids=["prefill-4b", "decode-4b", "prefill-32b"])
def test_qk_norm_rope_triton_full_size(t, hq, hk, dtype):
    check(t, hq, hk, 128, dtype, fused_qkv=True)


@pytest.mark.gpu
def test_public_op_on_cuda_is_the_kernel():
    q, k, q_weight, k_weight, positions, cos_sin = make(63, 32, 8, 128, torch.bfloat16, True)
    args = (q.cuda(), k.cuda(), q_weight.cuda(), k_weight.cuda(), EPS, positions.cuda(),
            cos_sin.cuda())
    for got, want in zip(openinfer_kernels.qk_norm_rope(*args), qk_norm_rope_triton(*args),
                         strict=True):
        assert torch.equal(got, want)


# --- qk_norm_rope_append: K (rotated) and V written straight into the paged cache -------------

def check_append(t, hq, hk, d, dtype, fused_qkv, block_size=4, heads=None):
    q, k, q_weight, k_weight, positions, cos_sin = make(t, hq, hk, d, dtype, fused_qkv)
    g = torch.Generator().manual_seed(1)
    v = torch.randn(t, hk, d, generator=g).to(dtype).to(DEVICE)
    num_blocks = t // block_size + 3
    slots = torch.randperm(num_blocks * block_size, generator=g)[:t]
    slots[::3] = -1  # padded rows write nothing
    slots = slots.to(DEVICE)
    caches = [torch.full((num_blocks, block_size, hk, d), float("nan"), dtype=dtype,
                         device=DEVICE) for _ in range(4)]
    got_q = qk_norm_rope_append_triton(q, k, v, q_weight, k_weight, EPS, positions, cos_sin,
                                       caches[0], caches[1], slots, heads=heads)
    want_q = qk_norm_rope_append_ref(q, k, v, q_weight, k_weight, EPS, positions, cos_sin,
                                     caches[2], caches[3], slots)
    assert got_q.dtype == dtype and got_q.is_contiguous()
    torch.testing.assert_close(got_q, want_q, **REF_TOL[dtype])
    written = slots >= 0
    flat = [c.view(-1, hk, d) for c in caches]
    torch.testing.assert_close(flat[0][slots[written]], flat[2][slots[written]], **REF_TOL[dtype])
    assert torch.equal(flat[1][slots[written]], flat[3][slots[written]])  # v: copied exactly
    untouched = torch.ones(flat[0].shape[0], dtype=torch.bool, device=DEVICE)
    untouched[slots[written]] = False
    assert flat[0][untouched].isnan().all() and flat[1][untouched].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_qk_norm_rope_append_matches_reference(case, dtype):
    check_append(*CASES[case][:4], dtype, fused_qkv=CASES[case][4])


@pytest.mark.gpu
@pytest.mark.parametrize(("t", "hq", "hk"), [(4096, 32, 8), (1, 32, 8)],
                         ids=["prefill-4b", "decode-4b"])
def test_qk_norm_rope_append_full_size(t, hq, hk):
    check_append(t, hq, hk, 128, torch.bfloat16, fused_qkv=True, block_size=16)
