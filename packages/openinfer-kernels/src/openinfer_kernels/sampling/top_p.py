# mypy: disable-error-code="no-untyped-def"
"""The exponential race restricted to each row's top-p nucleus, without sorting the row.

The nucleus N is a prefix of the row in stable descending order (higher logit first, lower id
first among equal ones): a token is in it when the probability strictly above it is short of
top_p. The race's winner over N is the best score x_v / ln 2 - log2 E_v among N, with E_v
`race_sample_triton`'s noise for (seed, v). One program per row finds it by pivots:

    w = the race's winner among the allowed tokens (at first, all of them)
    if the mass above w < top_p: w is in N, and as the best of a set holding N, the best of N
    else: nothing from w down is in N; allow only the tokens ranked above w, and race again

Every round removes w, and the top token (nothing above it) is always kept, so it ends; a
round fails with probability about 1 - top_p. So it picks the token `race_sample_triton`
picks on the row with everything outside N at -inf, up to the fp32 rounding of the mass at
the nucleus's edge (summed here in another order than the sort's cumulative sum). A round
reads the row twice (the race, the mass), and one pass before finds the row's max and
softmax normaliser.

(The mypy line above: @triton.jit kernels annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_kernels.sampling.triton import (
    _INTERPRETED,
    LOG2E,
    _keep_better,
    _neg_log2_exponential,
)

BLOCK = 2048  # ids per loop step (four Philox lanes of BLOCK // 4), as race_sample_triton's


@triton.jit
def _allowed(x, ids, pivot_x, pivot_id):
    """Ranked above the pivot in stable descending order."""
    return (x > pivot_x) | ((x == pivot_x) & (ids < pivot_id))


@triton.jit
def _lane_above(best, best_id, row_base, ids, V, bits, pivot_x, pivot_id, FAST: tl.constexpr):
    x = tl.load(row_base + ids, mask=ids < V, other=float("-inf")).to(tl.float32)
    score = x * LOG2E + _neg_log2_exponential(bits, FAST)
    keep = _allowed(x, ids, pivot_x, pivot_id) & (x > float("-inf"))
    return _keep_better(best, best_id, tl.where(keep, score, float("-inf")), ids)


@triton.jit
def _race_above(row_base, V, seed, pivot_x, pivot_id, BLOCK: tl.constexpr, FAST: tl.constexpr):
    """The race's winner (lowest id among equal scores) among the tokens above the pivot."""
    QUADS: tl.constexpr = BLOCK // 4
    best = tl.full([QUADS], float("-inf"), tl.float32)
    best_id = tl.zeros([QUADS], tl.int32)  # an all -inf row picks id 0, as race_sample_triton
    for start in range(0, V, BLOCK):
        quad = start // 4 + tl.arange(0, QUADS)
        r0, r1, r2, r3 = tl.randint4x(seed, quad)
        # Lanes in id order (4q, 4q+1, ...), so _keep_better's ties favour lower ids.
        best, best_id = _lane_above(best, best_id, row_base, 4 * quad, V, r0, pivot_x,
                                    pivot_id, FAST)
        best, best_id = _lane_above(best, best_id, row_base, 4 * quad + 1, V, r1, pivot_x,
                                    pivot_id, FAST)
        best, best_id = _lane_above(best, best_id, row_base, 4 * quad + 2, V, r2, pivot_x,
                                    pivot_id, FAST)
        best, best_id = _lane_above(best, best_id, row_base, 4 * quad + 3, V, r3, pivot_x,
                                    pivot_id, FAST)
    top = tl.max(best, axis=0)
    return tl.min(tl.where(best == top, best_id, 2**31 - 1), axis=0)


@triton.jit(do_not_specialize=["V"])
def _top_p_race_kernel(x_ptr, row_stride, top_p_ptr, seeds_ptr, out_ptr, V,
                       BLOCK: tl.constexpr, FAST: tl.constexpr):
    row = tl.program_id(0)
    row_base = x_ptr + row.to(tl.int64) * row_stride
    top_p = tl.load(top_p_ptr + row)
    seed = tl.load(seeds_ptr + row)
    # The row's max and softmax normaliser, online per position.
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        ids = start + tl.arange(0, BLOCK)
        x = tl.load(row_base + ids, mask=ids < V, other=float("-inf")).to(tl.float32)
        new_m = tl.maximum(m, x)
        finite = new_m > float("-inf")
        s = tl.where(finite, s * tl.exp2((m - new_m) * LOG2E) + tl.exp2((x - new_m) * LOG2E),
                     0.0)
        m = new_m
    row_max = tl.max(m, axis=0)
    total = tl.sum(tl.where(m > float("-inf"), s * tl.exp2((m - row_max) * LOG2E), 0.0), axis=0)
    winner = tl.zeros([], tl.int32)  # an all -inf row: id 0
    pivot_x = tl.full([], float("-inf"), tl.float32)
    pivot_id = tl.zeros([], tl.int32) + V  # every token allowed
    searching = row_max > float("-inf")
    while searching:
        winner = _race_above(row_base, V, seed, pivot_x, pivot_id, BLOCK, FAST)
        winner_x = tl.load(row_base + winner).to(tl.float32)
        above = tl.zeros([BLOCK], tl.float32)
        for start in range(0, V, BLOCK):
            ids = start + tl.arange(0, BLOCK)
            x = tl.load(row_base + ids, mask=ids < V, other=float("-inf")).to(tl.float32)
            above += tl.where(_allowed(x, ids, winner_x, winner),
                              tl.exp2((x - row_max) * LOG2E), 0.0)
        mass = tl.sum(above, axis=0)
        # The top id (nothing above it) always stays, whatever top_p: so the search ends.
        searching = (mass >= top_p * total) & (mass > 0.0)
        pivot_x = winner_x
        pivot_id = winner
    tl.store(out_ptr + row, winner.to(tl.int64))


def top_p_sample_triton(logits: torch.Tensor, top_p: torch.Tensor, seeds: torch.Tensor, *,
                        block: int = BLOCK, num_warps: int = 8) -> torch.Tensor:
    """One token id per row ([B] int64); the contract of reference.top_p_sample_ref, with
    race_sample_triton's noise. `block` (a power of two, >= 4) and `num_warps` tune the launch
    only."""
    rows, vocab = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows:
        _top_p_race_kernel[(rows,)](logits, logits.stride(0), top_p, seeds, out, vocab,
                                    BLOCK=block, FAST=not _INTERPRETED, num_warps=num_warps)
    return out
