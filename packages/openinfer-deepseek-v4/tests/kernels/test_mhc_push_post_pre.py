"""`hc_post` summed over the ranks and the next `hc_pre` in one launch
(`kernels/mhc/push_post_pre.py`), one token: the new streams are `hc_post_all_reduce`'s bits
and the next x, post and comb's logits `hc_pre`'s up to fp32 summation order, on one rank and
on 2 and 3 ranks in as many processes (CPU shared memory under the interpreter, as
test_mhc_push_post.py), interleaved there with the group's push all-reduce and `push_post` on
the same memory and call counts, every slot empty after. On GPUs the one-rank cases run at
V4-Flash's width too; two ranks on two GPUs: tests/gpu/test_tp_deepseek_v4_gpu.py
(`test_post_pre_against_plain_tp2`, the model's every position against the two launches)."""

from __future__ import annotations

import functools
import operator

import pytest
import torch
from test_mhc import LOGITS_TOL, TOL, WEIGHTS_TOL, make

from openinfer_deepseek_v4.kernels.mhc.push_post import hc_post_all_reduce_triton
from openinfer_deepseek_v4.kernels.mhc.push_post_pre import (
    column_block,
    hc_post_pre_all_reduce_triton,
)
from openinfer_deepseek_v4.kernels.mhc.triton import hc_post_triton, hc_pre_triton
from openinfer_kernels.collective.push_triton import EMPTY_BYTE, all_reduce_push_triton
from openinfer_kernels.testing.ranks import push_memory, run_ranks_forked

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N = 4
MIXING = dict(hc_eps=1e-6, sinkhorn_iters=20)
PRE = dict(hc_eps=1e-6, norm_eps=1e-6)


def _call(world: int, d: int, dtype: torch.dtype, seed: int, device: str = "cpu"):
    """Every rank's partial [1, D]; the streams, post, comb's logits; the next sublayer's fn,
    base, scale and norm weight (the same on every rank)."""
    streams, fn, base, scale, norm_weight = make(1, d, dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    partials = [(2 * torch.randn(1, d, generator=g)).to(device, dtype) for _ in range(world)]
    post = (2 * torch.sigmoid(torch.randn(1, N, generator=g))).to(device)
    comb = torch.randn(1, N, N, generator=g).to(device)
    return (partials, streams.to(device), post, comb, fn.to(device), base.to(device),
            scale.to(device), norm_weight.to(device))


def _check(got, partials, streams, post, comb, fn, base, scale, norm_weight) -> None:  # type: ignore[no-untyped-def]
    """got = (new streams, x, post, comb's logits) against hc_post of the rank-order fp32 sum,
    then hc_pre of those streams."""
    dtype = streams.dtype
    total = functools.reduce(operator.add, [p.float() for p in partials]).to(dtype)
    new = hc_post_triton(streams, total, post, comb, **MIXING)
    if dtype == torch.float32 or len(partials) == 1:
        assert torch.equal(got[0], new)
    else:  # the interpreter's casts truncate the sum where torch's round it (test_mhc.py)
        torch.testing.assert_close(got[0], new, rtol=2**-5, atol=2**-3)
    x, post2, logits2 = hc_pre_triton(got[0], fn, base, scale, norm_weight, **PRE)
    torch.testing.assert_close(got[1].float(), x.float(), **TOL[dtype])
    torch.testing.assert_close(got[2], post2, **WEIGHTS_TOL)
    torch.testing.assert_close(got[3], logits2, **LOGITS_TOL)


def test_a_program_owns_at_most_a_landing_row_of_columns() -> None:
    assert [column_block(d) for d in (24, 40, 1024, 4096, 8192)] == [16, 16, 16, 64, 128]


# 40: 3 programs of 16 columns, the last one short; 4096 (V4-Flash's width, on GPUs only: slow
# under the interpreter): 64 programs of 64, every row of the push memory
WIDTHS = [40, *([4096] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("d", WIDTHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_one_rank_is_post_then_pre(dtype: torch.dtype, d: int) -> None:
    areas, _, seqs = push_memory(1, d, dtype, shared=False, device=DEVICE)
    for seed in (1, 2):
        args = _call(1, d, dtype, seed, DEVICE)
        partials, streams, post, comb, fn, base, scale, norm_weight = args
        got = hc_post_pre_all_reduce_triton(streams, partials[0], post, comb, areas, seqs[0], 0,
                                            fn, base, scale, norm_weight, **MIXING,
                                            norm_eps=PRE["norm_eps"])
        assert got is not None and got[0].shape == (1, N, d) and got[1].shape == (1, d)
        _check(got, *args)
    programs = -(-d // column_block(d))
    assert seqs[0].tolist() == [2] * programs + [0] * (seqs[0].numel() - programs)


def test_more_tokens_are_left_to_the_two_launches() -> None:
    d = 16
    areas, _, seqs = push_memory(1, d, torch.float32, shared=False)
    streams, fn, base, scale, norm_weight = make(2, d, torch.float32)
    partial = torch.zeros(2, d)
    post, comb = torch.ones(2, N), torch.zeros(2, N, N)
    assert hc_post_pre_all_reduce_triton(streams.cpu(), partial, post, comb, areas, seqs[0], 0,
                                         fn.cpu(), base.cpu(), scale.cpu(), norm_weight.cpu(),
                                         **MIXING, norm_eps=1e-6) is None
    with pytest.raises(ValueError, match="fn"):
        hc_post_pre_all_reduce_triton(streams[:1].cpu(), partial[:1], post[:1], comb[:1], areas,
                                      seqs[0], 0, fn[:, :-1].cpu(), base.cpu(), scale.cpu(),
                                      norm_weight.cpu(), **MIXING, norm_eps=1e-6)
    assert not seqs[0].any()


# Successive calls, each on every rank: "fused" (this kernel), "post" (push_post, 2 rows),
# "sum" (the group's push all-reduce, 1 row).
CALLS = ("fused", "post", "fused", "sum", "fused")


def _run_rank(rank, calls, areas, seqs, outs):  # type: ignore[no-untyped-def]
    for n, (kind, call) in enumerate(zip(CALLS, calls, strict=True)):
        partials, streams, post, comb, fn, base, scale, norm_weight = call
        if kind == "fused":
            got = hc_post_pre_all_reduce_triton(streams, partials[rank], post, comb, areas,
                                                seqs[rank], rank, fn, base, scale, norm_weight,
                                                **MIXING, norm_eps=PRE["norm_eps"])
            assert got is not None
            flat = torch.cat([got[0].float().reshape(-1), got[1].float().reshape(-1),
                              got[2].reshape(-1), got[3].reshape(-1)])
        elif kind == "post":
            two = torch.cat([partials[rank], partials[rank]])
            flat = hc_post_all_reduce_triton(streams.expand(2, -1, -1).contiguous(), two,
                                             post.expand(2, -1).contiguous(),
                                             comb.expand(2, -1, -1).contiguous(), areas,
                                             seqs[rank], rank, **MIXING).float().reshape(-1)
        else:
            flat = all_reduce_push_triton(partials[rank], areas, seqs[rank], rank).float()
            flat = flat.reshape(-1)
        outs[rank][n][:flat.numel()].copy_(flat)


@pytest.mark.skipif(torch.cuda.is_available(), reason="ranks of CPU shared memory under the "
                    "interpreter; on GPUs: tests/gpu/test_tp_deepseek_v4_gpu.py")
@pytest.mark.parametrize(("world", "d"), [(2, 24), (3, 40)], ids=["2-ranks", "3-ranks"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ranks_in_processes_post_and_pre(world: int, d: int, dtype: torch.dtype) -> None:
    calls = [_call(world, d, dtype, seed=40 + n) for n in range(len(CALLS))]
    areas, _, seqs = push_memory(world, d, dtype, shared=True)
    outs = [torch.zeros(len(CALLS), 2 * N * d + d + N + N * N).share_memory_()
            for _ in range(world)]
    assert run_ranks_forked(world, _run_rank, calls, areas, seqs, outs) == [0] * (world - 1)
    for n, (kind, call) in enumerate(zip(CALLS, calls, strict=True)):
        for rank in range(world):
            assert torch.equal(outs[rank][n], outs[0][n]), f"call {n}: rank {rank} differs"
        if kind != "fused":
            continue
        row = outs[0][n]
        sizes = [N * d, d, N, N * N]
        new, x, post2, logits2 = row[:sum(sizes)].split(sizes)
        got = (new.view(1, N, d).to(dtype), x.view(1, d).to(dtype), post2.view(1, N),
               logits2.view(1, N, N))
        _check(got, *call)
    programs = -(-d // column_block(d))
    fused = CALLS.count("fused")
    # program p's count: a fused call each for p < programs, push_post's rows 0-1, the sum's 0
    want = [fused * (p < programs) + (p < 2) + (p < 1) for p in range(4)]
    for rank in range(world):
        assert seqs[rank][:4].tolist() == want
        assert bool((areas[rank].view(torch.uint8) == EMPTY_BYTE).all())
