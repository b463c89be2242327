"""The push form of the all-reduce + add + RMSNorm (`collective/push_triton.py`), and its
sum-only form (`all_reduce_push_triton`), against the reference: one rank alone, and 2 and 3
ranks in as many processes whose landing areas and flags are CPU shared memory mapped at the
same address in each (fork). Under the interpreter the ranks' programs really meet through the
flags, so the call counting (parities, flags that only grow, row counts that change from call
to call) is checked here, for both signals: flags, and the rows themselves (`signal="data"`:
slots empty as all-ones bits, emptied again once read); on GPUs it is
tests/gpu/test_tp_add_norm_gpu.py. The TTIR sweep compiles what this file launches."""

from __future__ import annotations

import functools
import operator

import pytest
import torch

from openinfer_kernels.collective.push_triton import (
    EMPTY_BYTE,
    PushAddNorm,
    all_reduce_add_rms_norm_push_triton,
    all_reduce_push_triton,
)
from openinfer_kernels.collective.triton import MAX_PROGRAMS
from openinfer_kernels.testing.ranks import push_memory, run_ranks_forked

from .test_all_reduce_add_norm import (
    DEVICE,
    EPS,
    assert_kernel_alike,
    in_rank_order,
    inputs,
)

SIGNALS = ["flags", "data"]


def _memory(world: int, h: int, dtype: torch.dtype, shared: bool, device: str = "cpu",
            signal: str = "flags"):
    """(every rank's area, every rank's flags, every rank's call counts): zeros, and areas
    empty as `signal` wants them."""
    return push_memory(world, h, dtype, shared=shared, device=device,
                       fill=PushAddNorm(signal).area_fill)


@pytest.mark.parametrize("signal", SIGNALS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_one_rank_is_the_reference(dtype, signal):
    h = 60
    areas, flags, seqs = _memory(1, h, dtype, shared=False, device=DEVICE, signal=signal)
    for t, seed in ((1, 1), (5, 2), (1, 3)):
        [x], residual, weight = inputs(1, t, h, dtype, seed=seed, device=DEVICE)
        x_before, residual_before = x.clone(), residual.clone()
        got = all_reduce_add_rms_norm_push_triton(x, residual, weight, EPS, areas, flags,
                                                  seqs[0], 0, signal)
        assert_kernel_alike(got, [x], residual, weight)
        assert torch.equal(x, x_before) and torch.equal(residual, residual_before)
    # Program 0 served three calls, programs 1-4 one (the call of 5 rows).
    assert seqs[0][:6].tolist() == [3, 1, 1, 1, 1, 0]
    assert not flags[0].any()  # no peer, no flag


def test_more_rows_than_programs_or_small_areas_are_refused():
    [x], residual, weight = inputs(1, MAX_PROGRAMS + 1, 8, torch.float32)
    areas, flags, seqs = _memory(1, 8, torch.float32, shared=False)
    with pytest.raises(ValueError, match="at most"):
        all_reduce_add_rms_norm_push_triton(x, residual, weight, EPS, areas, flags, seqs[0], 0)
    [x], residual, weight = inputs(1, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="too small"):
        all_reduce_add_rms_norm_push_triton(x, residual, weight, EPS, areas, flags, seqs[0], 0)


# Row counts of successive calls: program 0 serves all of them (parities 1, 0, 1, 0, ...),
# program 2 only the larger ones, so the programs' counts drift apart as on the GPU.
CALL_ROWS = (3, 1, 3, 1, 1)


def _run_rank(rank, calls, areas, flags, seqs, outs, signal):
    for n, (partials, residual, weight) in enumerate(calls):
        normed, summed = all_reduce_add_rms_norm_push_triton(
            partials[rank], residual, weight, EPS, areas, flags, seqs[rank], rank, signal)
        t = normed.shape[0]
        outs[rank][n, 0, :t].copy_(normed)
        outs[rank][n, 1, :t].copy_(summed)


@pytest.mark.skipif(torch.cuda.is_available(), reason="ranks of CPU shared memory under the "
                    "interpreter; on GPUs: tests/gpu/test_tp_add_norm_gpu.py")
@pytest.mark.parametrize("signal", SIGNALS)
@pytest.mark.parametrize(("world", "h"), [(2, 24), (3, 60)], ids=["2-ranks", "3-ranks"])
def test_ranks_in_processes_meet_through_the_flags(world, h, signal):
    dtype = torch.bfloat16
    calls = [inputs(world, t, h, dtype, seed=10 + n) for n, t in enumerate(CALL_ROWS)]
    areas, flags, seqs = _memory(world, h, dtype, shared=True, signal=signal)
    most = max(CALL_ROWS)
    outs = [torch.zeros(len(calls), 2, most, h, dtype=dtype).share_memory_()
            for _ in range(world)]
    exits = run_ranks_forked(world, _run_rank, calls, areas, flags, seqs, outs, signal)
    assert exits == [0] * (world - 1)
    for n, (partials, residual, weight) in enumerate(calls):
        t = partials[0].shape[0]
        for rank in range(world):
            assert torch.equal(outs[rank][n, :, :t], outs[0][n, :, :t]), "the ranks disagree"
        assert_kernel_alike((outs[0][n, 0, :t], outs[0][n, 1, :t]), partials, residual, weight)
    served = [sum(1 for t in CALL_ROWS if t > p) for p in range(most)]
    for rank in range(world):
        assert seqs[rank][:most].tolist() == served
        if signal == "data":  # no flag raised; every slot read out and empty again
            assert not flags[rank].any()
            assert bool((areas[rank].view(torch.uint8) == EMPTY_BYTE).all())
            continue
        # Each peer's flag for program p holds the last call it served.
        want = torch.tensor([[0 if q == rank else served[p] for q in range(world)]
                             for p in range(most)], dtype=torch.int32)
        assert torch.equal(flags[rank][:most * world].view(most, world), want)


@pytest.mark.skipif(torch.cuda.is_available(), reason="ranks of CPU shared memory under the "
                    "interpreter; on GPUs: tests/gpu/test_tp_add_norm_gpu.py")
def test_a_row_value_with_the_empty_bits_still_lands():
    """A partial whose value has the empty mark's bits (an all-ones NaN) is pushed as another
    NaN: the peer does not wait for it forever, and the sum is NaN where it should be."""
    world, h, dtype = 2, 16, torch.bfloat16
    calls = [inputs(world, 1, h, dtype, seed=3)]
    calls[0][0][1][0, 5] = torch.tensor(-1, dtype=torch.int16).view(torch.bfloat16)
    areas, flags, seqs = _memory(world, h, dtype, shared=True, signal="data")
    outs = [torch.zeros(1, 2, 1, h, dtype=dtype).share_memory_() for _ in range(world)]
    assert run_ranks_forked(world, _run_rank, calls, areas, flags, seqs, outs, "data") == [0]
    for rank in range(world):
        summed = outs[rank][0, 1, 0]
        assert summed[5].isnan() and not summed[torch.arange(h) != 5].isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_sum_alone_of_one_rank_is_its_rows(dtype):
    h = 60
    areas, _, seqs = _memory(1, h, dtype, shared=False, device=DEVICE, signal="data")
    for t, seed in ((1, 1), (5, 2)):
        [x], _, _ = inputs(1, t, h, dtype, seed=seed, device=DEVICE)
        x_before = x.clone()
        assert torch.equal(all_reduce_push_triton(x, areas, seqs[0], 0), x)
        assert torch.equal(x, x_before)
    assert seqs[0][:6].tolist() == [2, 1, 1, 1, 1, 0]
    # The flags form has no sum-only launch: the caller takes another path.
    assert PushAddNorm("flags").all_reduce(x, areas, seqs[0], 0) is None
    with pytest.raises(ValueError, match="at most"):
        all_reduce_push_triton(torch.zeros(MAX_PROGRAMS + 1, h, dtype=dtype, device=DEVICE),
                               areas, seqs[0], 0)


# Successive calls: (rows, sum alone?), interleaving both forms on the same memory and counts.
MIXED_CALLS = ((3, True), (1, False), (3, False), (1, True), (2, True))


def _run_rank_mixed(rank, calls, areas, flags, seqs, outs):
    for n, ((partials, residual, weight), (_, alone)) in enumerate(zip(calls, MIXED_CALLS,
                                                                       strict=True)):
        if alone:
            summed = all_reduce_push_triton(partials[rank], areas, seqs[rank], rank)
        else:
            _, summed = all_reduce_add_rms_norm_push_triton(
                partials[rank], residual, weight, EPS, areas, flags, seqs[rank], rank, "data")
            summed = summed - residual  # compared below against the sum plus the residual
        outs[rank][n, :summed.shape[0]].copy_(summed)


@pytest.mark.skipif(torch.cuda.is_available(), reason="ranks of CPU shared memory under the "
                    "interpreter; on GPUs: tests/gpu/test_tp_add_norm_gpu.py")
@pytest.mark.parametrize(("world", "h"), [(2, 24), (3, 60)], ids=["2-ranks", "3-ranks"])
def test_the_sum_alone_interleaves_with_the_add_norm_form(world, h):
    """Ranks in processes calling the sum-only and the add-norm forms in turn on one memory:
    every sum-only result is the fp32 rank-order sum, bit for bit, on every rank; every slot
    ends empty and each program's count is the calls it served."""
    dtype = torch.float32  # the add-norm form's summed less the residual is exact in fp32 here
    calls = [inputs(world, t, h, dtype, seed=20 + n) for n, (t, _) in enumerate(MIXED_CALLS)]
    areas, flags, seqs = _memory(world, h, dtype, shared=True, signal="data")
    most = max(t for t, _ in MIXED_CALLS)
    outs = [torch.zeros(len(calls), most, h, dtype=dtype).share_memory_() for _ in range(world)]
    assert run_ranks_forked(world, _run_rank_mixed, calls, areas, flags, seqs, outs) == \
        [0] * (world - 1)
    for n, ((partials, _, _), (t, alone)) in enumerate(zip(calls, MIXED_CALLS, strict=True)):
        want = in_rank_order([p.float() for p in partials]).to(dtype)  # the kernel's sum
        for rank in range(world):
            got = outs[rank][n, :t]
            if alone:
                assert torch.equal(got, want), f"call {n}: the sum differs on rank {rank}"
            else:
                torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    served = [sum(1 for t, _ in MIXED_CALLS if t > p) for p in range(most)]
    for rank in range(world):
        assert seqs[rank][:most].tolist() == served
        assert bool((areas[rank].view(torch.uint8) == EMPTY_BYTE).all())


def _run_rank_shares(rank, calls, areas, flags, seqs, outs):
    for n, (shares, residual, weight) in enumerate(calls):
        normed, summed = PushAddNorm("data").reduce_shares(shares[rank], residual, weight, EPS,
                                                           areas, flags, seqs[rank], rank)
        t = normed.shape[0]
        outs[rank][n, 0, :t].copy_(normed)
        outs[rank][n, 1, :t].copy_(summed)


@pytest.mark.skipif(torch.cuda.is_available(), reason="ranks of CPU shared memory under the "
                    "interpreter; on GPUs: tests/gpu/test_tp_add_norm_gpu.py")
def test_split_k_shares_are_summed_as_the_linear_sums_them():
    """A split-K product's fp32 shares handed over unsummed (`reduce_shares`), between calls of
    rows on the same memory: each rank's partial is its shares' sum in share order rounded to
    the stream's dtype, as the linear would have stored it, so the outputs are those of the
    rows' form, bit for bit (CPU shared memory under the interpreter only: see the skip)."""
    world, h, dtype = 2, 60, torch.bfloat16
    g = torch.Generator().manual_seed(5)
    calls = []
    for t, splits in ((1, 2), (3, 4), (1, 3)):
        shares = [torch.randn(splits, t, h, generator=g) for _ in range(world)]
        _, residual, weight = inputs(world, t, h, dtype, seed=20 + t)
        calls.append((shares, residual, weight))
    areas, flags, seqs = _memory(world, h, dtype, shared=True, signal="data")
    outs = [torch.zeros(len(calls), 2, 3, h, dtype=dtype).share_memory_() for _ in range(world)]
    assert run_ranks_forked(world, _run_rank_shares, calls, areas, flags, seqs, outs) == [0]
    for n, (shares, residual, weight) in enumerate(calls):
        t = residual.shape[0]
        # Each rank's partial as the kernel rounds its shares' sum: under the interpreter its
        # fp32 -> bf16 cast truncates (test_all_reduce_add_norm's `stream_as_the_kernel_rounds`).
        sums = [functools.reduce(operator.add, list(s)) for s in shares]
        partials = [(x.view(torch.int32) & -(1 << 16)).view(torch.float32).to(dtype)
                    for x in sums]
        for rank in range(world):
            assert_kernel_alike((outs[rank][n, 0, :t], outs[rank][n, 1, :t]), partials,
                                residual, weight)
    assert bool((areas[0].view(torch.uint8) == EMPTY_BYTE).all())


def test_shares_need_the_rows_as_their_signal():
    areas, flags, seqs = _memory(1, 8, torch.bfloat16, shared=False, signal="flags")
    shares = torch.zeros(2, 1, 8)
    residual, weight = torch.zeros(1, 8).bfloat16(), torch.ones(8).bfloat16()
    assert PushAddNorm("flags").reduce_shares(shares, residual, weight, EPS, areas, flags,
                                              seqs[0], 0) is None
    assert not PushAddNorm("flags").takes_shares and PushAddNorm("data").takes_shares
    with pytest.raises(ValueError, match="shares"):
        all_reduce_add_rms_norm_push_triton(shares.bfloat16(), residual, weight, EPS, areas,
                                            flags, seqs[0], 0, "data", shares=True)
