"""paged_decode_norm_rope: the decode attention kernel that norms and rotates its own q and new
k and appends the new K/V, against the two launches it replaces (`qk_norm_rope_append` then
`paged_decode`) and against the references. q, k and v are column slices of one fused qkv
output, as the model hands them over; caches hold NaN outside each request's context, so a
stray read, or a read of the new key before it was written, poisons the output."""

from __future__ import annotations

import pytest
import torch
from paged_cases import DECODES, DEVICE, LARGE, QWEN3_4B, TOL, Req, decodes, step_batch

from openinfer_kernels.attention import paged_attention_ref
from openinfer_kernels.attention.triton import NormRope, paged_decode, paged_decode_norm_rope
from openinfer_kernels.attention.triton_backend import TritonAttentionBackend
from openinfer_kernels.norm_rope import qk_norm_rope_append_ref
from openinfer_kernels.norm_rope.triton import qk_norm_rope_append_triton
from openinfer_kernels.rotary import rope_cos_sin

gpu = pytest.mark.gpu
THETA, EPS = 1_000_000.0, 1e-6
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
HEADS = pytest.mark.parametrize(("hq", "hk", "d"), [(5, 1, 60), (4, 2, 24), (2, 2, 64)],
                                ids=["gqa5-1-d60", "gqa4-2-d24", "mha2-d64"])
# The fused kernel sums each head's squares in one pass, qk_norm_rope in two halves: a normed
# value may round one ulp apart, which moves scores and outputs within the attention's bf16 TOL.
# The appended keys: one ulp of a normed, rotated value (|x| < 8 here: 2^-5), as REF_TOL allows.
KEY_TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2**-7, atol=2**-5)}


def step(reqs: list[Req], hq: int, hk: int, d: int, dtype: torch.dtype, seed: int = 0):
    """A decode step as the model meets it: the caches hold every request's context but its new
    token; q/k/v are the projection's raw output for that token (strided views of one tensor)."""
    case, k_new, v_new, batch = step_batch(reqs, hq, hk, d, dtype, seed)
    t = case.q.shape[0]
    qkv = torch.cat([case.q.reshape(t, -1), k_new.reshape(t, -1), v_new.reshape(t, -1)], dim=1)
    q = qkv[:, :hq * d].view(t, hq, d)
    k = qkv[:, hq * d:(hq + hk) * d].view(t, hk, d)
    v = qkv[:, (hq + hk) * d:].view(t, hk, d)
    g = torch.Generator().manual_seed(seed + 1)
    q_weight = (1 + 0.5 * torch.randn(d, generator=g)).to(dtype).to(DEVICE)
    k_weight = (1 + 0.5 * torch.randn(d, generator=g)).to(dtype).to(DEVICE)
    cos_sin = rope_cos_sin(batch.max_seq_len, d, THETA, DEVICE)
    norm_rope = NormRope(k, v, q_weight, k_weight, EPS, batch.positions, cos_sin,
                         batch.slot_mapping)
    return case, q, norm_rope, batch


def two_launches(case, q, nr: NormRope, scale: float, num_splits: int | None):
    """What the fused kernel replaces, on copies of the caches."""
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
    q_rot = qk_norm_rope_append_triton(q, nr.k, nr.v, nr.q_weight, nr.k_weight, nr.eps,
                                       nr.positions, nr.cos_sin, k_cache, v_cache,
                                       nr.slot_mapping)
    out = paged_decode(q_rot, k_cache, v_cache, case.block_tables, case.seq_lens,
                       case.query_start_loc, scale, num_splits)
    return out, k_cache, v_cache


def fused(case, q, nr: NormRope, scale: float, num_splits: int | None):
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
    out = paged_decode_norm_rope(q, k_cache, v_cache, case.block_tables, case.seq_lens,
                                 case.query_start_loc, scale, nr, num_splits)
    return out, k_cache, v_cache


def check(reqs, hq, hk, d, dtype, num_splits=None, seed=0):
    case, q, nr, _ = step(reqs, hq, hk, d, dtype, seed)
    scale = d ** -0.5
    q_before = q.clone()
    out, k_cache, v_cache = fused(case, q, nr, scale, num_splits)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    assert torch.isfinite(out).all(), "read a slot outside a context, or the new key unwritten"
    assert torch.equal(q, q_before)
    want, k_want, v_want = two_launches(case, q, nr, scale, num_splits)
    torch.testing.assert_close(out, want, **TOL[dtype])
    torch.testing.assert_close(k_cache, k_want, equal_nan=True, **KEY_TOL[dtype])
    assert torch.equal(v_cache.nan_to_num(7.0), v_want.nan_to_num(7.0))
    # And against the references, from the same raw q/k/v.
    k_ref, v_ref = case.k_cache.clone(), case.v_cache.clone()
    q_ref = qk_norm_rope_append_ref(q, nr.k, nr.v, nr.q_weight, nr.k_weight, nr.eps,
                                    nr.positions, nr.cos_sin, k_ref, v_ref, nr.slot_mapping)
    ref = paged_attention_ref(q_ref, k_ref, v_ref, case.block_tables, case.seq_lens,
                              case.query_start_loc, scale)
    if dtype == torch.float32 or DEVICE == "cuda":  # the interpreter's casts truncate (see
        torch.testing.assert_close(out, ref, **TOL[dtype])  # test_qk_norm_rope.py's REF_TOL)


@DTYPES
@HEADS
@pytest.mark.parametrize("batch", list(DECODES))
def test_matches_the_two_launches_and_the_reference(batch, hq, hk, d, dtype):
    check(DECODES[batch], hq, hk, d, dtype)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 7])
def test_any_split_may_hold_the_new_key(num_splits):
    # Contexts ending at the first, middle and last split, and just past a page.
    check(decodes(1, 16, 17, 40, 100, 129), 4, 2, 24, torch.bfloat16, num_splits, seed=3)


def test_a_negative_slot_appends_nothing():
    case, q, nr, _ = step(decodes(20, 33), 4, 2, 24, torch.float32)
    slots = nr.slot_mapping.clone()
    slots[0] = -1
    nr = nr._replace(slot_mapping=slots)
    _, k_cache, v_cache = fused(case, q, nr, 24 ** -0.5, 2)
    hk, d = k_cache.shape[2:]
    skipped = case.slots[0][-1]
    assert k_cache.view(-1, hk, d)[skipped].isnan().all()
    assert v_cache.view(-1, hk, d)[skipped].isnan().all()
    assert torch.isfinite(k_cache.view(-1, hk, d)[case.slots[1][-1]]).all()


def test_bad_shapes_are_refused():
    case, q, nr, _ = step(decodes(5), 4, 2, 24, torch.float32)
    with pytest.raises(ValueError, match="need q"):
        paged_decode_norm_rope(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                               case.query_start_loc, 1.0, nr._replace(v=nr.v[:, :1]))
    with pytest.raises(ValueError, match="contiguous"):
        strided = case.k_cache.transpose(0, 1).contiguous().transpose(0, 1)  # same shape
        paged_decode_norm_rope(q, strided, case.v_cache, case.block_tables, case.seq_lens,
                               case.query_start_loc, 1.0, nr)


@DTYPES
def test_backend_fuses_decode_steps_and_appends_first_on_others(dtype):
    backend = TritonAttentionBackend()
    for reqs in (decodes(3, 17, 40), [Req(context=30, queries=5), *decodes(9)]):
        case, q, nr, batch = step(reqs, 4, 2, 24, dtype, seed=5)
        k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
        out = backend.attend_normed(q, nr.k, nr.v, nr.q_weight, nr.k_weight, nr.eps,
                                    nr.cos_sin, k_cache, v_cache, batch, 24 ** -0.5)
        k_ref, v_ref = case.k_cache.clone(), case.v_cache.clone()
        q_ref = qk_norm_rope_append_ref(q, nr.k, nr.v, nr.q_weight, nr.k_weight, nr.eps,
                                        nr.positions, nr.cos_sin, k_ref, v_ref, nr.slot_mapping)
        ref = paged_attention_ref(q_ref, k_ref, v_ref, case.block_tables, case.seq_lens,
                                  case.query_start_loc, 24 ** -0.5)
        assert torch.isfinite(out).all()
        tol = TOL[dtype] if dtype == torch.float32 or DEVICE == "cuda" else dict(atol=0.1,
                                                                                rtol=0.05)
        torch.testing.assert_close(out, ref, **tol)
        torch.testing.assert_close(k_cache, k_ref, equal_nan=True,
                                   **(KEY_TOL[dtype] if DEVICE == "cuda" or dtype ==
                                      torch.float32 else dict(rtol=2**-5, atol=2**-3)))


@gpu
@pytest.mark.parametrize("batch", ["decode-b1-4k", "decode-b1-32k", "decode-b64-1k-2k"])
def test_qwen3_4b_shapes(batch):
    check(LARGE[batch], **QWEN3_4B, dtype=torch.bfloat16)
