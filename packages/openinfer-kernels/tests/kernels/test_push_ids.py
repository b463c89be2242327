"""Rank 0's token ids pushed onto every rank (`collective/push_ids.py`): 2 and 3 ranks in as
many processes whose id slots are CPU shared memory mapped at the same address in each
(fork), so under the interpreter the peers really poll for rank 0's stores. Between calls the
ranks meet (a barrier, as a model's all-reduce meets them after the ids); the GPU check is
the TP gate and `tplatency` (tests/gpu/test_tp_gpu.py)."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from openinfer_kernels.collective.push_ids import (
    ID_PROGRAMS,
    MAX_IDS,
    PushIds,
    id_slots,
    push_ids_triton,
)
from openinfer_kernels.testing.ranks import run_ranks_forked

# Ids a call carries: one program, three (past two blocks), one again, the most, a few.
CALL_IDS = (5, 2100, 1, MAX_IDS, 7)
VOCAB = 151_936


def _memory(world: int, shared: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every rank's id slots (empty: -1) and call counts (zeros)."""
    slots = [torch.full((id_slots(),), -1, dtype=torch.int32) for _ in range(world)]
    seqs = [torch.zeros(ID_PROGRAMS, dtype=torch.int32) for _ in range(world)]
    if shared:
        for t in (*slots, *seqs):
            t.share_memory_()
    return slots, seqs


def _calls() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in CALL_IDS]


def _run_rank(rank, calls, slots, seqs, outs, meet):
    for n, want in enumerate(calls):
        ids = want.clone() if rank == 0 else torch.zeros_like(want)
        assert push_ids_triton(ids, slots, seqs[rank], rank)
        outs[rank][n, :ids.numel()].copy_(ids)
        meet.wait(60)  # the forward's all-reduce after the ids


@pytest.mark.skipif(torch.cuda.is_available(), reason="ranks of CPU shared memory under the "
                    "interpreter; on GPUs: tests/gpu/test_tp_gpu.py")
@pytest.mark.parametrize("world", [2, 3], ids=["2-ranks", "3-ranks"])
def test_every_rank_gets_rank_0s_ids(world: int) -> None:
    calls = _calls()
    slots, seqs = _memory(world, shared=True)
    outs = [torch.full((len(calls), MAX_IDS), -7, dtype=torch.int64).share_memory_()
            for _ in range(world)]
    meet = multiprocessing.get_context("fork").Barrier(world)
    exits = run_ranks_forked(world, _run_rank, calls, slots, seqs, outs, meet)
    assert exits == [0] * (world - 1)
    for n, want in enumerate(calls):
        for rank in range(world):
            assert torch.equal(outs[rank][n, :want.numel()], want), (rank, n)
    # Program p served the calls that reached past p blocks, on every rank alike; every
    # peer's slots were read out and emptied; rank 0's own were never written.
    served = [sum(1 for n in CALL_IDS if n > p * 1024) for p in range(ID_PROGRAMS)]
    for rank in range(world):
        assert seqs[rank].tolist() == served
        assert bool((slots[rank] == -1).all())


def test_what_does_not_fit_is_left_alone() -> None:
    slots, seqs = _memory(2, shared=False)
    too_many = torch.zeros(MAX_IDS + 1, dtype=torch.int64)
    assert not push_ids_triton(too_many, slots, seqs[0], 0)
    assert not push_ids_triton(torch.zeros(2, 3, dtype=torch.int64), slots, seqs[0], 0)
    assert not push_ids_triton(torch.zeros(4), slots, seqs[0], 0)  # float ids
    assert not seqs[0].any() and bool((slots[1] == -1).all())
    with pytest.raises(ValueError, match="rank 5 of 2"):
        push_ids_triton(torch.zeros(3, dtype=torch.int64), slots, seqs[0], 5)
    with pytest.raises(ValueError, match="id_slots"):
        push_ids_triton(torch.zeros(3, dtype=torch.int64), [s[:10] for s in slots], seqs[0], 1)


def test_one_rank_is_a_no_op() -> None:
    slots, seqs = _memory(1, shared=False)
    ids = torch.arange(9)
    assert PushIds()(ids, slots, seqs[0], 0)
    assert torch.equal(ids, torch.arange(9)) and not seqs[0].any()
    assert PushIds.slots == id_slots() and PushIds.programs == ID_PROGRAMS
