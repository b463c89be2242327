# mypy: disable-error-code="no-untyped-def"
"""Triton ordered causal top-k over score rows: `indexer_topk_ordered_ref`'s picks, exactly.

Each score becomes one int64 key, (the score's order-preserving bits << 32) | (2^32 - 1 - j),
so that a plain descending sort ranks higher scores first and equal scores by earlier entry
(-0.0 counted as 0.0). A program streams its part of a row in chunks of KP (top_k padded to a
power of two): the chunk sorted ascending against the running best sorted descending,
elementwise max, holds the best KP of both (a bitonic split). That maximum falls and then rises
(a bitonic sequence), so a bitonic merge of log2(KP) compare-exchange stages sorts it again,
where a sort takes log2(KP) * (log2(KP) + 1) / 2 (9 against 45 at KP = 512); a chunk that beats
nothing is skipped. A long row (a 64k context: 16k entries, 32 chunks of
512) is cut into pieces, one program each (`_piece_kernel`), whose best lists
`_merge_kernel` folds the same way, one sort per piece: fewer serial sorts, and more programs
for a decode batch of one. The piece count follows the row's width, which a long prompt's
chunks widen step by step, so it is a runtime argument: a new count compiles nothing (as a
constant, each of its 16 values compiled both kernels anew, on a cold start in the middle of
a long prompt's steps).

(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from openinfer_kernels.pdl import pdl_enter, pdl_launch

NONE_KEY: tl.constexpr = tl.constexpr(-9223372036854775807)  # below every real key: no pick
MAX_PIECES = 16


@triton.jit
def entry_rows(entries, table_ptr, RATIO: tl.constexpr, BLOCK_SIZE: tl.constexpr,
               SLOTS_PER_BLOCK: tl.constexpr):
    """Pool rows of entries j: in the block of token (j + 1) * RATIO - 1 (the model's
    kv_cache.py), through the request's block table row `table_ptr`."""
    last = (entries + 1) * RATIO - 1
    blocks = tl.load(table_ptr + last // BLOCK_SIZE).to(tl.int64)
    return blocks * SLOTS_PER_BLOCK + (last % BLOCK_SIZE) // RATIO


@triton.jit
def ordered_bits(scores):
    """int32 with the scores' order: a higher score, a higher value. -0.0 counts as 0.0 (a
    negative weight times a ReLU'd 0 is -0.0, and it ties with 0.0)."""
    s = tl.where(scores == 0.0, 0.0, scores)
    bits = s.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def sortable_keys(scores, entries, valid):
    """Sortable int64 keys: descending order = higher score first, then earlier entry
    (`ordered_bits` of the score, then the entry)."""
    key = (ordered_bits(scores).to(tl.int64) << 32) | (4294967295 - entries.to(tl.int64))
    return tl.where(valid, key, NONE_KEY)


@triton.jit
def _merge_descending(x, KP: tl.constexpr, LOG_KP: tl.constexpr):
    """A bitonic sequence x [KP] (here one that falls, then rises) sorted descending: at each
    stride s = KP/2 .. 1, within every block of 2s the larger of elements i and i + s goes
    first."""
    for stage in tl.static_range(LOG_KP):
        x = _merge_stage(x, KP, 1 << stage, KP >> (stage + 1))
    return x


@triton.jit
def _merge_stage(x, KP: tl.constexpr, BLOCKS: tl.constexpr, HALF: tl.constexpr):
    """One compare-exchange stage of `_merge_descending`: x [KP] as BLOCKS blocks of 2 x HALF,
    the larger of each pair (i, i + HALF) first."""
    pairs = tl.permute(tl.reshape(x, [BLOCKS, 2, HALF]), (0, 2, 1))
    first, second = tl.split(pairs)
    merged = tl.join(tl.maximum(first, second), tl.minimum(first, second))
    return tl.reshape(tl.permute(merged, (0, 2, 1)), [KP])


@triton.jit
def _fold(best, ascending, KP: tl.constexpr, LOG_KP: tl.constexpr):
    """The best KP of `best` (sorted descending) and `ascending` (sorted ascending), sorted
    descending; `best` itself when `ascending` beats none of it."""
    if tl.max(ascending, 0) > tl.min(best, 0):
        best = _merge_descending(tl.maximum(best, ascending), KP, LOG_KP)
    return best


@triton.jit
def store_picks(best, token, positions_ptr, table_ptr, requests_ptr, out_ptr, width,
                 stride_bt, stride_ot, RATIO: tl.constexpr, AS_SLOTS: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr, SLOTS_PER_BLOCK: tl.constexpr, KP: tl.constexpr):
    """The first `width` picks of `best`: entry numbers (or with AS_SLOTS pool rows), -1 for
    none."""
    offs = tl.arange(0, KP)
    picked = best != NONE_KEY
    entries = tl.where(picked, 4294967295 - (best & 4294967295), -1)
    if AS_SLOTS:
        request = tl.load(requests_ptr + token).to(tl.int64)
        rows = entry_rows(tl.where(picked, entries, 0), table_ptr + request * stride_bt,
                          RATIO, BLOCK_SIZE, SLOTS_PER_BLOCK)
        entries = tl.where(picked, rows, -1)
    tl.store(out_ptr + token * stride_ot + offs, entries.to(out_ptr.dtype.element_ty),
             mask=offs < width)


@triton.jit(do_not_specialize=["piece_len", "pieces"])
def _piece_kernel(
    scores_ptr, positions_ptr, table_ptr, requests_ptr, out_ptr, part_ptr,
    num_entries, width, piece_len, pieces, stride_st, stride_bt, stride_ot,
    RATIO: tl.constexpr, AS_SLOTS: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    SLOTS_PER_BLOCK: tl.constexpr, KP: tl.constexpr, SINGLE: tl.constexpr, PDL: tl.constexpr,
    LOG_KP: tl.constexpr,
):
    pdl_enter(PDL)
    token = tl.program_id(0).to(tl.int64)
    piece = tl.program_id(1)
    visible = tl.minimum((tl.load(positions_ptr + token) + 1) // RATIO, num_entries)
    end = tl.minimum(visible, (piece + 1) * piece_len)
    offs = tl.arange(0, KP)
    best = tl.full([KP], NONE_KEY, tl.int64)  # sorted descending throughout
    for start in range(piece * piece_len, end, KP):
        entries = start + offs
        valid = entries < end
        scores = tl.load(scores_ptr + token * stride_st + entries, mask=valid, other=0.0)
        best = _fold(best, tl.sort(sortable_keys(scores, entries, valid)), KP, LOG_KP)
    if SINGLE:
        store_picks(best, token, positions_ptr, table_ptr, requests_ptr, out_ptr, width,
                    stride_bt, stride_ot, RATIO, AS_SLOTS, BLOCK_SIZE, SLOTS_PER_BLOCK, KP)
    else:  # scratch [T, pieces, KP], each list stored ascending, as the merge folds them
        tl.store(part_ptr + (token * pieces + piece) * KP + (KP - 1 - offs), best)


@triton.jit(do_not_specialize=["pieces"])
def _merge_kernel(
    part_ptr, positions_ptr, table_ptr, requests_ptr, out_ptr, width, pieces, stride_bt,
    stride_ot, RATIO: tl.constexpr, AS_SLOTS: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    SLOTS_PER_BLOCK: tl.constexpr, KP: tl.constexpr, SINGLE: tl.constexpr, PDL: tl.constexpr,
    LOG_KP: tl.constexpr,
):
    pdl_enter(PDL)
    token = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, KP)
    best = tl.full([KP], NONE_KEY, tl.int64)
    for piece in range(pieces):
        best = _fold(best, tl.load(part_ptr + (token * pieces + piece) * KP + offs), KP,
                     LOG_KP)
    store_picks(best, token, positions_ptr, table_ptr, requests_ptr, out_ptr, width,
                 stride_bt, stride_ot, RATIO, AS_SLOTS, BLOCK_SIZE, SLOTS_PER_BLOCK, KP)


def num_pieces(num_entries: int, kp: int) -> int:
    """Pieces per row: about sqrt(2 x chunks), balancing a piece's two sorts per chunk against
    the merge's one per piece; from the shapes only."""
    return max(1, min(MAX_PIECES, math.isqrt(2 * triton.cdiv(num_entries, kp))))


def launch_topk(scores: torch.Tensor, positions: torch.Tensor, out: torch.Tensor, ratio: int,
                paged: dict[str, object], pieces: int | None = None) -> None:
    """Fill out [T, width] with the ordered top `width` of each row of scores [T, E] among its
    first (position + 1) // ratio entries: entry numbers, or with paged["as_slots"] rows of
    the entry pool through paged["block_tables"] and paged["requests"]."""
    num_tokens, num_entries = scores.shape
    width = out.shape[1]
    kp = max(16, triton.next_power_of_2(width))
    pieces = pieces or num_pieces(num_entries, kp)
    piece_len = triton.cdiv(triton.cdiv(num_entries, pieces), kp) * kp
    table = paged.get("block_tables", scores)
    requests = paged.get("requests", scores)
    assert isinstance(table, torch.Tensor)
    part = torch.empty(num_tokens, pieces, kp, dtype=torch.int64, device=scores.device) \
        if pieces > 1 else out
    common = dict(RATIO=ratio, AS_SLOTS=bool(paged.get("as_slots", False)),
                  BLOCK_SIZE=paged.get("block_size", 1),
                  SLOTS_PER_BLOCK=paged.get("slots_per_block", 1), KP=kp,
                  LOG_KP=kp.bit_length() - 1, SINGLE=pieces == 1,
                  num_warps=4 if kp <= 512 else 8, **pdl_launch(scores))
    _piece_kernel[(num_tokens, pieces)](
        scores, positions, table, requests, out, part, num_entries, width, piece_len, pieces,
        scores.stride(0), table.stride(0), out.stride(0), **common)
    if pieces > 1:
        _merge_kernel[(num_tokens,)](part, positions, table, requests, out, width, pieces,
                                     table.stride(0), out.stride(0), **common)
