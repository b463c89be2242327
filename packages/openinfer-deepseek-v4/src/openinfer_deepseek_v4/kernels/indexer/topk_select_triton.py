# mypy: disable-error-code="no-untyped-def"
"""Triton ordered causal top-k by radix select: `indexer_topk_ordered_ref`'s picks, exactly,
without sorting the row.

One program a row. Each score's order-preserving 32 bits (-0.0 counted as 0.0, as
`topk_triton.ordered_bits`) are an unsigned key. Four passes over the row, each a histogram of
one byte of the key among the entries whose higher bytes equal the threshold's so far, find
the threshold key: fewer than `width` entries lie above it, and at least `width` at or above
it. A fifth pass gathers the entries above it and, in entry order, as many entries equal to it
as are still needed (the tie rule: the earlier entry first). At most `width` picks (KP padded)
are then sorted once. The row is read five times, where `topk_triton` sorts every 512-entry
chunk of it; `benchmarks/device/dsv4_indexer_bench.py` times the two on a prompt step.

A row is one program's serial work, so a step of few tokens (decode) keeps `topk_triton`,
which cuts a row into pieces over the GPU.

(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_deepseek_v4.kernels.indexer.topk_triton import (
    NONE_KEY,
    ordered_bits,
    sortable_keys,
    store_picks,
)
from openinfer_kernels.pdl import pdl_enter, pdl_launch

BINS: tl.constexpr = tl.constexpr(256)  # a byte's values


@triton.jit
def _unsigned_key(scores):
    """[0, 2^32) int64: higher score, higher key (`ordered_bits`, shifted to unsigned)."""
    return ordered_bits(scores).to(tl.int64) + 2147483648


@triton.jit
def _byte_histogram(row_ptr, visible, prefix, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    """[BINS] counts of byte SHIFT/8 of the keys of entries [0, visible) whose bytes above it
    equal `prefix`'s. (The others go to bin 0 and are taken out of it after: a histogram of
    256 bins costs half one of 512, which a bin of their own would need.)"""
    hist = tl.zeros([BINS], dtype=tl.int32)
    others = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, visible, BLOCK):
        entries = start + tl.arange(0, BLOCK)
        valid = entries < visible
        key = _unsigned_key(tl.load(row_ptr + entries, mask=valid, other=0.0))
        same = valid & ((key >> (SHIFT + 8)) == (prefix >> (SHIFT + 8)))
        hist += tl.histogram(tl.where(same, (key >> SHIFT) & 255, 0).to(tl.int32), BINS)
        others += (~same).to(tl.int32)
    return hist - tl.where(tl.arange(0, BINS) == 0, tl.sum(others, 0), 0)


@triton.jit
def _select_kernel(
    scores_ptr, positions_ptr, table_ptr, requests_ptr, out_ptr, picks_ptr,
    num_entries, width, stride_st, stride_bt, stride_ot,
    RATIO: tl.constexpr, AS_SLOTS: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    SLOTS_PER_BLOCK: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    token = tl.program_id(0).to(tl.int64)
    row_ptr = scores_ptr + token * stride_st
    visible = tl.minimum((tl.load(positions_ptr + token) + 1) // RATIO, num_entries)
    need = tl.minimum(width, visible)  # picks still to place at or above the threshold
    bins = tl.arange(0, BINS)
    prefix = tl.zeros([], dtype=tl.int64)  # the threshold's bytes found so far
    for i in tl.static_range(4):
        hist = _byte_histogram(row_ptr, visible, prefix, 24 - 8 * i, BLOCK)
        at_or_above = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist
        # The highest byte with `need` entries at or above it; those above it are all picks.
        byte = tl.max(tl.where(at_or_above >= need, bins, 0), 0)
        need -= tl.sum(tl.where(bins > byte, hist, 0), 0)
        prefix = prefix | (byte.to(tl.int64) << (24 - 8 * i))
    # Gather: every entry above the threshold, and the first `need` equal to it.
    picks_row = picks_ptr + token * KP
    taken = tl.zeros([], dtype=tl.int32)
    ties = tl.zeros([], dtype=tl.int32)
    for start in range(0, visible, BLOCK):
        entries = start + tl.arange(0, BLOCK)
        valid = entries < visible
        scores = tl.load(row_ptr + entries, mask=valid, other=0.0)
        key = _unsigned_key(scores)
        tie = valid & (key == prefix)
        tie_rank = ties + tl.cumsum(tie.to(tl.int32), 0) - 1
        take = (valid & (key > prefix)) | (tie & (tie_rank < need))
        slot = taken + tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(picks_row + slot, sortable_keys(scores, entries, valid), mask=take)
        taken += tl.sum(take.to(tl.int32), 0)
        ties += tl.sum(tie.to(tl.int32), 0)
    tl.debug_barrier()  # the gathered picks, stored by every thread, read back by all
    offs = tl.arange(0, KP)
    best = tl.load(picks_row + offs, mask=offs < taken, other=NONE_KEY)
    best = tl.sort(best, descending=True)
    store_picks(best, token, positions_ptr, table_ptr, requests_ptr, out_ptr, width,
                 stride_bt, stride_ot, RATIO, AS_SLOTS, BLOCK_SIZE, SLOTS_PER_BLOCK, KP)


def launch_topk_select(scores: torch.Tensor, positions: torch.Tensor, out: torch.Tensor,
                       ratio: int, paged: dict[str, object]) -> None:
    """`topk_triton.launch_topk`'s contract, one program a row."""
    num_tokens, num_entries = scores.shape
    width = out.shape[1]
    kp = max(16, triton.next_power_of_2(width))
    table = paged.get("block_tables", scores)
    requests = paged.get("requests", scores)
    assert isinstance(table, torch.Tensor)
    picks = torch.empty(num_tokens, kp, dtype=torch.int64, device=scores.device)
    _select_kernel[(num_tokens,)](
        scores, positions, table, requests, out, picks, num_entries, width, scores.stride(0),
        table.stride(0), out.stride(0), RATIO=ratio,
        AS_SLOTS=bool(paged.get("as_slots", False)), BLOCK_SIZE=paged.get("block_size", 1),
        SLOTS_PER_BLOCK=paged.get("slots_per_block", 1), KP=kp, BLOCK=1024,
        num_warps=4 if kp <= 512 else 8, **pdl_launch(scores))
