"""`hc_post` with the tensor-parallel sum in its launch (`kernels/mhc/push_post.py`): one rank
alone is `hc_post_triton` of its own partial, bit for bit; 2 and 3 ranks in as many processes
(their landing areas CPU shared memory mapped at the same address in each, fork; under the
interpreter the ranks' programs really meet) give every rank `hc_post_triton` of the rank-order
fp32 sum (bit for bit in fp32; in bf16 within the interpreter's truncating casts), interleaved
with the group's push all-reduce on the same memory and call counts, every slot empty again
after. On GPUs: tests/gpu/test_tp_deepseek_v4_gpu.py (the model at
TP2 against one GPU). The TTIR sweep compiles what this file launches."""

from __future__ import annotations

import functools
import operator

import pytest
import torch

from openinfer_deepseek_v4.kernels.mhc.push_post import hc_post_all_reduce_triton
from openinfer_deepseek_v4.kernels.mhc.triton import hc_post_triton
from openinfer_kernels.collective.push_triton import (
    EMPTY_BYTE,
    all_reduce_push_triton,
)
from openinfer_kernels.collective.triton import MAX_PROGRAMS
from openinfer_kernels.testing.ranks import push_memory, run_ranks_forked

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N = 4
MIXING = dict(hc_eps=1e-6, sinkhorn_iters=20)  # comb from its logits, in the kernel
push_post = functools.partial(hc_post_all_reduce_triton, **MIXING)


def _inputs(world: int, t: int, d: int, dtype: torch.dtype, seed: int, device: str = "cpu"):
    """(every rank's partial [T, D], the streams [T, N, D], post [T, N], comb's logits
    [T, N, N]): all but the partials the same on every rank, as in the model."""
    g = torch.Generator().manual_seed(seed)
    partials = [(2 * torch.randn(t, d, generator=g)).to(device, dtype) for _ in range(world)]
    streams = (torch.randn(t, N, d, generator=g) * torch.tensor([1.0, 3.0, 0.5, 2.0])[:, None])
    post = 2 * torch.sigmoid(torch.randn(t, N, generator=g))
    comb = torch.randn(t, N, N, generator=g)
    return partials, streams.to(device, dtype), post.to(device), comb.to(device)


def _want(partials, streams, post, comb) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """`hc_post_triton` of the sum of the partials in fp32, in rank order, rounded once."""
    total = functools.reduce(operator.add, [p.float() for p in partials]).to(streams.dtype)
    return hc_post_triton(streams, total, post, comb, **MIXING)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_one_rank_is_hc_post_of_its_partial(dtype: torch.dtype) -> None:
    d = 48
    areas, _, seqs = push_memory(1, d, dtype, shared=False, device=DEVICE)
    for t, seed in ((1, 1), (5, 2)):
        partials, streams, post, comb = _inputs(1, t, d, dtype, seed, DEVICE)
        got = push_post(streams, partials[0], post, comb, areas, seqs[0], 0)
        assert got.shape == (t, N, d) and got.dtype == dtype
        assert torch.equal(got, hc_post_triton(streams, partials[0], post, comb, **MIXING))
    assert seqs[0][:6].tolist() == [2, 1, 1, 1, 1, 0]


def test_wrong_shapes_and_too_many_rows_are_refused() -> None:
    d = 16
    areas, _, seqs = push_memory(1, d, torch.float32, shared=False)
    partials, streams, post, comb = _inputs(1, 2, d, torch.float32, 3)
    with pytest.raises(ValueError, match="partial"):
        push_post(streams, partials[0][:, :8], post, comb, areas, seqs[0], 0)
    with pytest.raises(ValueError, match="partial"):
        push_post(streams, partials[0].half(), post, comb, areas, seqs[0], 0)
    many = _inputs(1, MAX_PROGRAMS + 1, d, torch.float32, 4)
    with pytest.raises(ValueError, match="at most"):
        push_post(many[1], many[0][0], many[2], many[3], areas, seqs[0], 0)
    with pytest.raises(ValueError, match="too small"):
        push_post(streams, partials[0], post, comb, [areas[0][:10]], seqs[0], 0)


# Successive calls: (rows, with hc_post?): the group's push all-reduce between them.
CALLS = ((3, True), (1, False), (3, True), (2, True), (1, False))


def _run_rank(rank, calls, areas, seqs, outs):  # type: ignore[no-untyped-def]
    for n, ((partials, streams, post, comb), (_, post_too)) in enumerate(
            zip(calls, CALLS, strict=True)):
        if post_too:
            got = hc_post_all_reduce_triton(streams, partials[rank], post, comb, areas,
                                            seqs[rank], rank, **MIXING)
        else:
            got = all_reduce_push_triton(partials[rank], areas, seqs[rank], rank)
        outs[rank][n].view(-1)[:got.numel()].copy_(got.reshape(-1))


@pytest.mark.skipif(torch.cuda.is_available(), reason="ranks of CPU shared memory under the "
                    "interpreter; on GPUs: tests/gpu/test_tp_deepseek_v4_gpu.py")
@pytest.mark.parametrize(("world", "d"), [(2, 24), (3, 40)], ids=["2-ranks", "3-ranks"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ranks_in_processes_sum_and_expand(world: int, d: int, dtype: torch.dtype) -> None:
    calls = [_inputs(world, t, d, dtype, seed=30 + n) for n, (t, _) in enumerate(CALLS)]
    areas, _, seqs = push_memory(world, d, dtype, shared=True)
    most = max(t for t, _ in CALLS)
    outs = [torch.zeros(len(CALLS), most, N, d, dtype=dtype).share_memory_()
            for _ in range(world)]
    assert run_ranks_forked(world, _run_rank, calls, areas, seqs, outs) == [0] * (world - 1)
    for n, ((partials, streams, post, comb), (_, post_too)) in enumerate(
            zip(calls, CALLS, strict=True)):
        total = functools.reduce(operator.add, [p.float() for p in partials]).to(dtype)
        want = _want(partials, streams, post, comb) if post_too else total
        first = outs[0][n].view(-1)[:want.numel()].view(want.shape)
        for rank in range(world):
            got = outs[rank][n].view(-1)[:want.numel()].view(want.shape)
            assert torch.equal(got, first), f"call {n}: rank {rank} differs from rank 0"
        if dtype == torch.float32:
            assert torch.equal(first, want), f"call {n}: the result differs"
        else:  # the interpreter's casts truncate the sum where torch's round it (test_mhc.py)
            torch.testing.assert_close(first, want, rtol=2**-5, atol=2**-3)
    served = [sum(1 for t, _ in CALLS if t > p) for p in range(most)]
    for rank in range(world):
        assert seqs[rank][:most].tolist() == served
        assert bool((areas[rank].view(torch.uint8) == EMPTY_BYTE).all())
