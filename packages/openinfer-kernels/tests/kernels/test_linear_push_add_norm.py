"""The row-split linear whose output pushes itself into the peers' memory, then the add and the
norm (`collective/linear_push_triton.py`), against each rank's small-batch linear
(`linear_triton` at the same tile: the same products and share sums, so the same bits) followed
by the push reference: one rank alone, and 2 and 3 ranks in forked processes over CPU shared
memory (as test_all_reduce_add_norm_push.py), its calls interleaved with the push kernel's on
the same landing areas and counts. On GPUs: tests/gpu/test_tp_add_norm_gpu.py. The TTIR sweep
compiles what this file launches."""

from __future__ import annotations

import pytest
import torch

from openinfer_kernels import split_k
from openinfer_kernels.collective.linear_push_triton import (
    MAX_ROWS,
    linear_push_add_rms_norm_triton,
)
from openinfer_kernels.collective.push_triton import (
    EMPTY_BYTE,
    all_reduce_add_rms_norm_push_triton,
    flag_slots,
)
from openinfer_kernels.gemm.triton import Tile, linear_triton
from openinfer_kernels.testing.ranks import push_memory, run_ranks_forked

from .test_all_reduce_add_norm import DEVICE, EPS, assert_kernel_alike

TILES = {"split-3": Tile(block_n=16, block_k=32, split_k=3, num_warps=4, num_stages=2),
         "whole-k": Tile(block_n=32, block_k=64, split_k=1, num_warps=4, num_stages=2)}


def _case(world: int, t: int, h: int, k: int, dtype: torch.dtype, seed: int,
          device: str = "cpu"):
    """(every rank's x [T, K] and weight shard [H, K], the residual, the norm weight)."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(t, k, generator=g).to(device, dtype) for _ in range(world)]
    ws = [(0.1 * torch.randn(h, k, generator=g)).to(device, dtype) for _ in range(world)]
    residual = torch.randn(t, h, generator=g).to(device, dtype)
    weight = (1 + 0.5 * torch.randn(h, generator=g)).to(device, dtype)
    return xs, ws, residual, weight


@pytest.mark.parametrize("tile", list(TILES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_one_rank_is_the_linear_then_the_push_reference(dtype, tile):
    h, k = 40, 96
    areas, _, seqs = push_memory(1, h, dtype, shared=False, device=DEVICE)
    for n, t in enumerate((1, 3, 1)):
        [x], [w], residual, weight = _case(1, t, h, k, dtype, seed=n, device=DEVICE)
        got = linear_push_add_rms_norm_triton(x, w, TILES[tile], residual, weight, EPS, areas,
                                              seqs[0], 0)
        assert got is not None
        assert_kernel_alike(got, [linear_triton(x, w, TILES[tile])], residual, weight)
    assert seqs[0][:4].tolist() == [3, 1, 1, 0]
    assert bool((areas[0].view(torch.uint8) == EMPTY_BYTE).all())
    assert not split_k.split_counters(x.device).any()


def test_more_rows_than_it_takes_are_left_alone():
    h, k = 40, 96
    areas, _, seqs = push_memory(1, h, torch.float32, shared=False)
    [x], [w], residual, weight = _case(1, MAX_ROWS + 1, h, k, torch.float32, seed=0)
    assert linear_push_add_rms_norm_triton(x, w, TILES["whole-k"], residual, weight, EPS,
                                           areas, seqs[0], 0) is None
    assert not seqs[0].any()
    small, _, _ = push_memory(1, 8, torch.float32, shared=False)
    with pytest.raises(ValueError, match="too small"):
        linear_push_add_rms_norm_triton(x[:1], w, TILES["whole-k"], residual[:1], weight, EPS,
                                        small, seqs[0], 0)


# (rows, kernel) of successive calls: the fused linear and the push kernel on the same areas.
CALLS = ((1, "linear"), (3, "push"), (2, "linear"), (3, "linear"), (1, "push"), (1, "linear"))


def _run_rank(rank, calls, tile, areas, seqs, outs):
    for n, (kind, xs, ws, residual, weight) in enumerate(calls):
        if kind == "linear":
            got = linear_push_add_rms_norm_triton(xs[rank], ws[rank], tile, residual, weight,
                                                  EPS, areas, seqs[rank], rank)
            assert got is not None
        else:  # xs are the partials themselves
            unused = [torch.zeros(flag_slots(len(areas)), dtype=torch.int32)] * len(areas)
            got = all_reduce_add_rms_norm_push_triton(xs[rank], residual, weight, EPS, areas,
                                                      unused, seqs[rank], rank, "data")
        t = got[0].shape[0]
        outs[rank][n, 0, :t].copy_(got[0])
        outs[rank][n, 1, :t].copy_(got[1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="ranks of CPU shared memory under the "
                    "interpreter; on GPUs: tests/gpu/test_tp_add_norm_gpu.py")
@pytest.mark.parametrize("tile", list(TILES))
@pytest.mark.parametrize("world", [2, 3], ids=["2-ranks", "3-ranks"])
def test_ranks_in_processes_meet_through_their_rows(world, tile):
    h, k, dtype = 40, 96, torch.bfloat16
    calls = []
    for n, (t, kind) in enumerate(CALLS):
        xs, ws, residual, weight = _case(world, t, h, k, dtype, seed=20 + n)
        if kind == "push":
            xs = [x[:, :h].contiguous() for x in xs]  # partial rows of width H
        calls.append((kind, xs, ws, residual, weight))
    areas, _, seqs = push_memory(world, h, dtype, shared=True)
    most = max(t for t, _ in CALLS)
    outs = [torch.zeros(len(CALLS), 2, most, h, dtype=dtype).share_memory_()
            for _ in range(world)]
    assert run_ranks_forked(world, _run_rank, calls, TILES[tile], areas, seqs, outs) == \
        [0] * (world - 1)
    for n, (kind, xs, ws, residual, weight) in enumerate(calls):
        t = xs[0].shape[0]
        for rank in range(world):
            assert torch.equal(outs[rank][n, :, :t], outs[0][n, :, :t]), "the ranks disagree"
        partials = xs if kind == "push" else [linear_triton(x, w, TILES[tile])
                                              for x, w in zip(xs, ws, strict=True)]
        assert_kernel_alike((outs[0][n, 0, :t], outs[0][n, 1, :t]), partials, residual, weight)
    served = [sum(1 for t, _ in CALLS if t > p) for p in range(most)]
    for rank in range(world):
        assert seqs[rank][:most].tolist() == served
        assert bool((areas[rank].view(torch.uint8) == EMPTY_BYTE).all())
