# mypy: disable-error-code="no-untyped-def"
"""Rank 0's token ids onto every rank of a tensor-parallel group at the start of a step, pushed
rather than broadcast: rank 0 writes them straight into each peer's memory and the peers poll
their own, one NVLink crossing. A Qwen3-8B TP2 batch-1 step took 2.733 ms this way against 2.744
with NCCL's broadcast (`gpu_check.sh tplatency`, TP_VARIANTS=OPENINFER_TP_IDS=nccl, 2 H200s).

Memory, a symmetric region every rank maps (the push kernels' region, `PushMemory`):
- `areas[r]`: rank r's landing slots, int32 [2 parities][MAX_IDS], -1 (all ones) while empty;
- `seqs`: this rank's own int32 [ID_PROGRAMS], how many calls each program has served.

Program p carries ids [p BLOCK, (p + 1) BLOCK) (a call of T ids runs the programs that T
reaches, the same on every rank). Call n of program p (n = its count + 1, the same on every
rank) uses parity n % 2: rank 0 stores the ids as int32 into every peer's slots; a peer polls
its own slots past the caches until none is empty (an id is never -1, and an int32 store lands
whole), copies them into its ids tensor and empties the slots. Rank 0 never waits, so a slot is
refilled (call n + 2) only after its reader emptied it if the ranks meet in between: the
caller's forward must hold a collective that waits on every peer after each call (a model's
all-reduce does: a peer joins it only after its own call n + 1, which followed call n).
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from openinfer_kernels.collective.push_triton import count_call
from openinfer_kernels.pdl import pdl_enter, pdl_launch

MAX_IDS = 8192  # ids one call carries (a step's tokens; more go another way)
BLOCK = 1024  # ids a program carries
ID_PROGRAMS = MAX_IDS // BLOCK
EMPTY_ID = -1


def id_slots() -> int:
    """The int32 slots of one rank's landing area: two parities of `MAX_IDS`."""
    return 2 * MAX_IDS


@triton.jit
def _push_ids_kernel(ids_ptr, areas, seq_ptr, T, RANK: tl.constexpr, WORLD: tl.constexpr,
                     MAX_IDS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # areas: every rank's landing slots (int32), in rank order.
    pdl_enter(PDL)
    pid = tl.program_id(0)
    seq = count_call(seq_ptr + pid)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < T
    slots = tl.cast(seq % 2, tl.int64) * MAX_IDS + offs
    if RANK == 0:
        ids = tl.load(ids_ptr + offs, mask=mask).to(tl.int32)
        for peer in tl.static_range(1, WORLD):
            tl.store(areas[peer] + slots, ids, mask=mask)
    else:
        # Written by another GPU: read past the caches until every id has landed.
        got = tl.load(areas[RANK] + slots, mask=mask, other=0, volatile=True)
        waiting = tl.sum(((got == -1) & mask).to(tl.int32))
        while waiting > 0:
            got = tl.load(areas[RANK] + slots, mask=mask, other=0, volatile=True)
            waiting = tl.sum(((got == -1) & mask).to(tl.int32))
        # The loop's sum needed every thread's last read: the slots are read out.
        tl.store(areas[RANK] + slots, tl.full(got.shape, -1, tl.int32), mask=mask)
        tl.store(ids_ptr + offs, got.to(ids_ptr.dtype.element_ty), mask=mask)


def push_ids_triton(ids: torch.Tensor, areas: Sequence[torch.Tensor], seqs: torch.Tensor,
                    rank: int) -> bool:
    """Rank 0's `ids` (1-D int32 or int64, contiguous, at most `MAX_IDS`, each in [0, 2^31))
    in place on every rank; False, nothing done, where the call does not fit (the same answer
    on every rank). Collective: every rank calls it with the same length, in the same order,
    with a collective that waits on every peer after it (see the module docstring). `areas`:
    every rank's int32 slots (`id_slots`, -1 before the first call), in rank order; `seqs`:
    this rank's int32 call counts (`ID_PROGRAMS`, zeros at first)."""
    world = len(areas)
    t = ids.numel()
    if (ids.dim() != 1 or not ids.is_contiguous() or ids.dtype not in (torch.int32, torch.int64)
            or t > MAX_IDS):
        return False
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} of {world}")
    if areas[rank].numel() < id_slots() or seqs.numel() < ID_PROGRAMS:
        raise ValueError(f"slots of {areas[rank].numel()} and counts of {seqs.numel()}: see "
                         f"id_slots and ID_PROGRAMS")
    if t and world > 1:
        _push_ids_kernel[(triton.cdiv(t, BLOCK),)](
            ids, tuple(areas), seqs, t, RANK=rank, WORLD=world, MAX_IDS=MAX_IDS, BLOCK=BLOCK,
            num_warps=4, **pdl_launch(ids))
    return True


class PushIds:
    """openinfer-core's `SymmetricIdsKernel` over this module: the call and the sizes of the
    memory it needs (its slots start as -1: all-ones bytes)."""

    slots = id_slots()
    programs = ID_PROGRAMS
    fill = 0xFF

    def __call__(self, ids: torch.Tensor, areas: Sequence[torch.Tensor], seqs: torch.Tensor,
                 rank: int) -> bool:
        return push_ids_triton(ids, areas, seqs, rank)
