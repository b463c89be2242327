"""rms_rotary (DeepSeek-V4's RMSNorm + interleaved rotary from a position table) against its
reference, and the reference against the model's composition of the two pieces (rms_norm,
then `rotary_interleaved_ref` from the frequencies): odd head counts and dims, strided rows,
no norm, no weight, no rotary, the inverse rotation, and the scatter into pool rows."""

from __future__ import annotations

import pytest
import torch

from openinfer_deepseek_v4.kernels.rotary import (
    rms_rotary_ref,
    rms_rotary_scatter_ref,
    rope_frequencies,
    rope_table,
    rotary_interleaved_ref,
)
from openinfer_deepseek_v4.kernels.rotary.triton import rms_rotary_scatter_triton, rms_rotary_triton

# The kernel runs compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6
MAX_POSITIONS = 300
# fp32: the same math, the norm's sum in another order. bf16: both sides round at the same
# points (the normed row, the rotated pairs), an fp32 difference may flip one rounding: one
# ulp (2^-8 relative) of values up to ~4.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2**-7, atol=2**-6)}
if DEVICE == "cpu":  # the interpreter's casts truncate: up to one more ulp per rounding point
    TOL[torch.bfloat16] = dict(rtol=2**-6, atol=2**-5)

# (T, H, D, rope dims); H 0 means x is [T, D]
SHAPES = [(1, 0, 512, 64), (7, 0, 60, 16), (5, 3, 24, 24), (63, 5, 60, 16), (2, 64, 64, 16),
          (3, 2, 16, 0)]
SHAPE_IDS = ["t1-d512", "t7-d60", "t5-h3-all-rope", "t63-h5-d60", "t2-h64", "no-rope"]
MODES = {  # (norm, weight, inverse)
    "norm-weight": (True, True, False),
    "norm": (True, False, False),
    "rotate": (False, False, False),
    "inverse": (False, False, True),
}


def inputs(t: int, h: int, d: int, rope: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(t, *([h] if h else []), d + 6, generator=g) * 3
    x = wide[..., 3:d + 3].to(dtype)  # rows strided, D contiguous
    weight = (1 + 0.5 * torch.randn(d, generator=g)).to(dtype)
    positions = torch.randint(0, MAX_POSITIONS, (t,), generator=g)
    positions[0] = MAX_POSITIONS - 1  # the table's last row
    table = None
    if rope:
        freqs = rope_frequencies(rope, 160000.0, yarn_factor=16, original_max_positions=65536)
        table = rope_table(freqs, MAX_POSITIONS, dtype)
    return x, weight, positions, table


# every shape in every mode, but a rotation-only mode of the shape without rotary dims
CASES = [pytest.param(*shape, mode, id=f"{name}-{mode}")
         for shape, name in zip(SHAPES, SHAPE_IDS, strict=True) for mode in MODES
         if shape[3] or MODES[mode][0]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "h", "d", "rope", "mode"), CASES)
def test_kernel_matches_reference(t, h, d, rope, mode, dtype):
    norm, with_weight, inverse = MODES[mode]
    x, weight, positions, table = inputs(t, h, d, rope, dtype)
    w = weight if with_weight else None
    eps = EPS if norm else None
    want = rms_rotary_ref(x, w, positions, table, eps=eps, inverse=inverse)
    dev = [None if a is None else a.to(DEVICE) for a in (x, w, positions, table)]
    got = rms_rotary_triton(*dev, eps=eps, inverse=inverse)
    assert got.shape == x.shape and got.dtype == dtype
    torch.testing.assert_close(got.cpu(), want, **TOL[dtype])
    if rope < d:  # the dims before the rotary ones: only the norm touched them
        torch.testing.assert_close(got[..., :d - rope].cpu(), want[..., :d - rope],
                                   **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_reference_is_the_models_norm_then_rotary(dtype, inverse):
    """The table's cos/sin are the per-step ones (same fp32 angles, same rounding)."""
    t, h, d, rope = 9, 3, 60, 16
    x, weight, positions, _ = inputs(t, h, d, rope, dtype, seed=1)
    freqs = rope_frequencies(rope, 10000.0)
    table = rope_table(freqs, MAX_POSITIONS, dtype)
    xf = x.float()
    normed = (weight.float() * xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + EPS))
    want = rotary_interleaved_ref(normed.to(dtype), positions, freqs, inverse=inverse)
    got = rms_rotary_ref(x, weight, positions, table, eps=EPS, inverse=inverse)
    # cos/sin of one angle may differ by an fp32 ulp between a vectorized and a scalar loop
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6) if dtype == torch.float32 \
        else torch.testing.assert_close(got, want, rtol=2**-8, atol=2**-8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "d", "rope"), [(1, 512, 64), (6, 60, 16)], ids=["t1", "t6"])
def test_scatter_writes_only_its_rows(t, d, rope, dtype):
    x, weight, positions, table = inputs(t, 0, d, rope, dtype, seed=2)
    slots = torch.randperm(3 * t, generator=torch.Generator().manual_seed(3))[:t]
    if t > 1:
        slots[-1] = -1  # a skipped token
    want = torch.full((3 * t, d), float("nan"), dtype=dtype)
    rms_rotary_scatter_ref(x, weight, positions, table, want, slots, eps=EPS)
    got = want.new_full(want.shape, float("nan")).to(DEVICE)
    rms_rotary_scatter_triton(x.to(DEVICE), weight.to(DEVICE), positions.to(DEVICE),
                              table.to(DEVICE), got, slots.to(DEVICE), eps=EPS)
    written = slots[slots >= 0]
    untouched = torch.ones(3 * t, dtype=torch.bool)
    untouched[written] = False
    assert want[untouched].isnan().all() and got[untouched.to(DEVICE)].isnan().all()
    torch.testing.assert_close(got[written.to(DEVICE)].cpu(), want[written], **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "d", "rope"), [(1, 512, 64), (6, 80, 16)], ids=["t1", "t6"])
def test_scatter_rounds_to_fp8_as_the_rounding_launch_does(t, d, rope, dtype):
    """`fp8_rope_dims`: the written rows' non-rotary values rounded to e4m3 in the store, the
    same bits as the scatter followed by `quant_sim`'s own rounding launch."""
    from openinfer_deepseek_v4.kernels.quant_sim.triton import fp8_round_rows_triton

    x, weight, positions, table = inputs(t, 0, d, rope, dtype, seed=4)
    slots = torch.randperm(3 * t, generator=torch.Generator().manual_seed(5))[:t].to(DEVICE)
    if t > 1:
        slots[-1] = -1  # a skipped token
    args = [a.to(DEVICE) for a in (x, weight, positions, table)]
    apart = torch.zeros(3 * t, d, dtype=dtype, device=DEVICE)
    rms_rotary_scatter_triton(*args, apart, slots, eps=EPS)
    unrounded = apart.clone()
    fp8_round_rows_triton(apart, slots, rope)
    fused = torch.zeros_like(apart)
    rms_rotary_scatter_triton(*args, fused, slots, eps=EPS, fp8_rope_dims=rope)
    assert torch.equal(fused, apart)
    written = slots[slots >= 0]
    assert not torch.equal(fused[written, :d - rope], unrounded[written, :d - rope])
    assert torch.equal(fused[:, d - rope:], unrounded[:, d - rope:])  # the rotary dims kept
    want = torch.zeros(3 * t, d, dtype=dtype)
    rms_rotary_scatter_ref(x, weight, positions, table, want, slots.cpu(), eps=EPS,
                           fp8_rope_dims=rope)
    # the reference rounds from its own normed rows: the kernel's are within TOL of them, and
    # an e4m3 step (2^-3 relative) may separate a value rounded from either
    torch.testing.assert_close(fused.cpu(), want, rtol=2**-3, atol=2**-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "h", "d", "rope", "fp8"),
                         [(1, 64, 512, 64, True), (5, 3, 80, 16, False), (4, 9, 80, 16, True)],
                         ids=["t1-h64-d512-fp8", "t5-h3-d80", "t4-h9-d80-fp8"])
def test_queries_and_entries_in_one_launch_as_in_two(t, h, d, rope, fp8, dtype):
    """`q_kv_rms_rotary_triton`: the queries as `rms_rotary_triton` (per-head norm, no
    weight, rotated) and the entries as `rms_rotary_scatter_triton`, bit for bit, and the
    reference the two references."""
    from openinfer_deepseek_v4.kernels.rotary import q_kv_rms_rotary_ref
    from openinfer_deepseek_v4.kernels.rotary.triton import q_kv_rms_rotary_triton

    q, _, positions, table = inputs(t, h, d, rope, dtype, seed=6)
    kv, weight, _, _ = inputs(t, 0, d, rope, dtype, seed=7)
    slots = torch.randperm(3 * t, generator=torch.Generator().manual_seed(8))[:t]
    if t > 1:
        slots[-1] = -1  # a skipped token
    fp8_dims = rope if fp8 else None
    dev = [a.to(DEVICE) for a in (q, kv, weight, positions, table, slots)]
    q_d, kv_d, weight_d, positions_d, table_d, slots_d = dev
    pool = torch.zeros(3 * t, d, dtype=dtype, device=DEVICE)
    got = q_kv_rms_rotary_triton(q_d, kv_d, weight_d, positions_d, table_d, pool, slots_d,
                                 eps=EPS, fp8_rope_dims=fp8_dims)
    apart = torch.zeros_like(pool)
    rms_rotary_scatter_triton(kv_d, weight_d, positions_d, table_d, apart, slots_d, eps=EPS,
                              fp8_rope_dims=fp8_dims)
    assert torch.equal(got, rms_rotary_triton(q_d, None, positions_d, table_d, eps=EPS))
    assert torch.equal(pool, apart)
    want_pool = torch.zeros(3 * t, d, dtype=dtype)
    want = q_kv_rms_rotary_ref(q, kv, weight, positions, table, want_pool, slots, eps=EPS,
                               fp8_rope_dims=fp8_dims)
    torch.testing.assert_close(got.cpu(), want, **TOL[dtype])
    if not fp8:
        torch.testing.assert_close(pool.cpu(), want_pool, **TOL[dtype])


def test_rejects_a_table_wider_than_the_rows():
    x = torch.randn(2, 8, device=DEVICE)
    table = rope_table(rope_frequencies(16, 10000.0), 4, torch.float32).to(DEVICE)
    with pytest.raises(ValueError, match="table"):
        rms_rotary_triton(x, None, torch.zeros(2, dtype=torch.long, device=DEVICE), table,
                          eps=EPS)
