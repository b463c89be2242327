# mypy: disable-error-code="no-untyped-def"
"""A row-split linear layer, its all-reduce, the residual add and the RMSNorm in one launch, for
a decode step's few rows: the small-batch linear (`gemm/triton.py`'s product and split-K
shares) whose output pushes itself into the peers' memory, as `push_triton.py`'s data-signalled
kernel pushes a row, so no all-reduce kernel follows it.

Program (column block, K share) multiplies as the small-batch linear does. The last share of
a column block to arrive sums the block's shares in share order (`split_k.py`'s counts),
rounds the columns to x's dtype (the bits the unfused linear stores) and writes them into
every rank's landing area, its own included: parity seq % 2 of row m's slot, seq the row's
call count (`seqs[m] + 1`, read by every program; the same on every rank). Then it counts
itself in again, on the launch's block count; the last column block to arrive (one program)
waits for every rank's whole rows in its own landing area (empty slots hold all-ones bits, as
in `push_triton.py`; a value with those bits is pushed as another NaN), sums them in fp32 in
rank order, rounds the sum to x's dtype, adds the residual and normalises it
(`_add_rms_norm_row`: the push kernel's bits), empties the slots and stores the rows' counts.
The landing areas, counts and slot protocol are the push kernel's, so the two interleave on
the same memory: a slot is written again two calls later, only after its reader emptied it
(the writer's next call waited for the reader's row of that call, which the reader pushed in a
later launch than the one that emptied the slot).

One program does every row's add and norm, so the launch suits a few rows (`MAX_ROWS`); more
take the linear and then the push kernel.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from openinfer_kernels import split_k
from openinfer_kernels.collective.push_triton import (
    EMPTY_BYTE,
    area_elements,
    pushed,
    take_landed,
)
from openinfer_kernels.collective.triton import MAX_PROGRAMS
from openinfer_kernels.dot import dot_options
from openinfer_kernels.gemm import small_batch_tile
from openinfer_kernels.gemm.triton import Tile, partial_product
from openinfer_kernels.norm.triton import _add_rms_norm_row, row_settings
from openinfer_kernels.pdl import pdl_enter, pdl_launch

# Rows one launch takes: its last program adds and normalises them one after another.
MAX_ROWS = 4


@triton.jit
def _add_norm_landed_row(areas, seq_ptr, res_ptr, nw_ptr, out_ptr, sum_ptr, row, H,
                         res_row_stride, eps, RANK: tl.constexpr, WORLD: tl.constexpr,
                         PROGRAMS: tl.constexpr, BITS: tl.constexpr, BLOCK_H: tl.constexpr):
    """Row `row` of every rank, waited for in this rank's landing area, summed in rank order,
    added to the residual and normalised; its slots emptied and its call count stored."""
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    seq = tl.load(seq_ptr + row) + 1
    parity = tl.cast(seq % 2, tl.int64)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for writer in tl.static_range(WORLD):
        slot = areas[RANK] + ((parity * WORLD + writer) * PROGRAMS + row) * H + cols
        acc += take_landed(slot, mask, BITS).to(tl.float32)
    s = acc.to(sum_ptr.dtype.element_ty).to(tl.float32)
    r = tl.load(res_ptr + row * res_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    _add_rms_norm_row(s, r, nw_ptr, out_ptr, sum_ptr, row, H, eps, cols, mask, True)
    tl.debug_barrier()  # every thread has read the count before it is moved on
    tl.store(seq_ptr + row, seq)


@triton.jit(do_not_specialize=["M"])
def _linear_push_add_rms_norm_kernel(
    x_ptr, w_ptr, part_ptr, count_ptr, areas, seq_ptr, res_ptr, nw_ptr, out_ptr, sum_ptr,
    M, H, K, stride_xm, stride_wn, res_row_stride, k_per_split, eps,
    RANK: tl.constexpr, WORLD: tl.constexpr, PROGRAMS: tl.constexpr, BITS: tl.constexpr,
    M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_H: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    blocks = tl.num_programs(0)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, M_PAD)
    n_ok = rn < H
    m_ok = rm < M
    mask = m_ok[:, None] & n_ok[None, :]
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    pdl_enter(PDL)
    y = partial_product(x_ptr, w_ptr, rn, n_ok, rm, M, k_start, k_end, stride_xm, stride_wn, M_PAD,
                 BLOCK_N, BLOCK_K, PRECISION, UPCAST)
    block_count = count_ptr + pid_n
    last = True
    if SPLIT_K > 1:  # the shares meet in the fp32 workspace [SPLIT_K, M, H]
        tl.store(part_ptr + (split * M + rm[:, None]) * H + rn[None, :], y, mask=mask)
        tl.debug_barrier()  # the whole share is stored before it is counted
        last = tl.atomic_add(block_count, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1
    if last:
        if SPLIT_K > 1:
            y = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
            for s in range(SPLIT_K):  # in share order; the others' rows from L2 (.cg)
                y += tl.load(part_ptr + (s * M + rm[:, None]) * H + rn[None, :], mask=mask,
                             other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(block_count, 0, sem="relaxed", scope="gpu")
        sent = pushed(y.to(x_ptr.dtype.element_ty), BITS)
        parity = tl.cast((tl.load(seq_ptr + rm, mask=m_ok, other=0) + 1) % 2, tl.int64)
        mine = ((parity * WORLD + RANK) * PROGRAMS + rm)[:, None] * H + rn[None, :]
        for peer in tl.static_range(WORLD):
            tl.store(areas[peer] + mine, sent, mask=mask)
        tl.debug_barrier()  # the block's columns are pushed before it is counted
        launch_count = count_ptr + blocks
        if tl.atomic_add(launch_count, 1, sem="acq_rel", scope="gpu") == blocks - 1:
            for row in range(M):
                _add_norm_landed_row(areas, seq_ptr, res_ptr, nw_ptr, out_ptr, sum_ptr, row, H,
                                     res_row_stride, eps, RANK, WORLD, PROGRAMS, BITS, BLOCK_H)
            tl.atomic_xchg(launch_count, 0, sem="relaxed", scope="gpu")


def linear_push_add_rms_norm_triton(x: torch.Tensor, w: torch.Tensor, tile: Tile,
                                    residual: torch.Tensor, weight: torch.Tensor, eps: float,
                                    areas: Sequence[torch.Tensor], seqs: torch.Tensor,
                                    rank: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rms_norm(s + residual) * weight, s + residual), s the sum over the ranks of x @ w.T
    (each rank's x [M, K] and w [H, K] its shard of a row-split layer), at `tile` (the
    small-batch linear's, from `small_batch_tile`), in new tensors; None where this launch
    cannot take it (more than `MAX_ROWS` rows, or no arrival counts at hand inside a CUDA graph
    capture), and nothing is done. Collective: every rank calls it with the same shapes, in the
    same order, interleaved as it likes with `all_reduce_add_rms_norm_push_triton` calls of
    data signal over the same `areas` and `seqs`."""
    m, k = x.shape
    h = w.shape[0]
    world = len(areas)
    if (m > MAX_ROWS or x.stride(1) != 1 or not w.is_contiguous() or w.shape[1] != k
            or x.element_size() not in (2, 4) or not 0 <= rank < world):
        return None
    if areas[rank].numel() < area_elements(world, h) or seqs.numel() < MAX_PROGRAMS:
        raise ValueError(f"areas of {areas[rank].numel()} and counts of {seqs.numel()} are too "
                         f"small for {world} ranks of width {h}: see area_elements")
    blocks = triton.cdiv(h, tile.block_n)
    counts = split_k.counts_for(x.device, blocks + 1)
    if counts is None:
        return None
    res = residual if residual.stride(-1) == 1 else residual.contiguous()
    normed = torch.empty((m, h), dtype=x.dtype, device=x.device)
    summed = torch.empty((m, h), dtype=x.dtype, device=x.device)
    if m == 0:
        return normed, summed
    split = tile.split_k
    k_per_split = triton.cdiv(triton.cdiv(k, split), tile.block_k) * tile.block_k
    shares = (torch.empty((split, m, h), dtype=torch.float32, device=x.device) if split > 1
              else normed)
    block_h, _ = row_settings(h)
    _linear_push_add_rms_norm_kernel[(blocks, split)](
        x, w, shares, counts, tuple(areas), seqs, res, weight, normed, summed, m, h, k,
        x.stride(0), w.stride(0), res.stride(0), k_per_split, eps, RANK=rank, WORLD=world,
        PROGRAMS=MAX_PROGRAMS, BITS=8 * x.element_size(), M_PAD=1 if m == 1 else 16,
        BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, SPLIT_K=split, BLOCK_H=block_h,
        **dot_options(x), num_warps=tile.num_warps, num_stages=tile.num_stages,
        **pdl_launch(x))
    return normed, summed


class LinearPushAddNorm:
    """openinfer-core's `SymmetricLinearPushKernel` over this module: the call (None where the
    weight is not a plain tensor of x's dtype with a small-batch Triton tile, or the launch
    does not take the rows), its row limit and the byte the landing areas start as (the data
    signal's, shared with the push kernel's memory)."""

    max_rows = MAX_ROWS
    area_fill = EMPTY_BYTE

    def __call__(self, x: torch.Tensor, w: object, residual: torch.Tensor,
                 weight: torch.Tensor, eps: float, areas: Sequence[torch.Tensor],
                 seqs: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not isinstance(w, torch.Tensor) or w.dtype != x.dtype or x.dim() != 2:
            return None
        tile = small_batch_tile(x, w)
        if tile is None:
            return None
        return linear_push_add_rms_norm_triton(x, w, tile, residual, weight, eps, areas, seqs,
                                               rank)
