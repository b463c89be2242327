# mypy: disable-error-code="no-untyped-def"
"""`hc_post` of a row-split sublayer's output summed over the tensor-parallel ranks, in one
launch for a decode step's few rows: each rank's partial row is pushed into its peers' landing
areas and read back summed as the group's push all-reduce does
(`openinfer_kernels.collective.push_triton`: the same memory, call counts and protocol, the
rows their own signal), and the program that summed token t's row expands it into the token's
new streams at once, as `_expand_kernel` does. One launch where the all-reduce and the
expansion took two, per sublayer.

Program t (one per token, at most the push memory's rows): call count seq = seqs[t] + 1,
parity seq % 2; the partial row goes into slot (parity, this rank, t) of every peer's area;
the peers' rows are polled in this rank's own area until landed, added in fp32 in rank order
and rounded to the streams' dtype (the bits of the group's push all-reduce), and the slots are
emptied again; then H'_k = post_k out + sum_j comb[j, k] H_j with `_expand_kernel`'s
rounding points, comb from hc_pre's logits before the PDL wait as there. (The mypy line
above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from openinfer_deepseek_v4.kernels.mhc.triton import comb_of, expand_columns
from openinfer_kernels.collective.push_triton import (
    EMPTY_BYTE,
    area_elements,
    copies,
    exchange_row,
)
from openinfer_kernels.collective.triton import MAX_PROGRAMS
from openinfer_kernels.pdl import pdl_enter, pdl_launch


@triton.jit
def _push_post_kernel(x_ptr, streams_ptr, post_ptr, logits_ptr, new_ptr, areas, seq_ptr, D,
                      stride_x, stride_st, stride_sn, hc_eps, iters, RANK: tl.constexpr,
                      WORLD: tl.constexpr, PROGRAMS: tl.constexpr, BITS: tl.constexpr,
                      N: tl.constexpr, BLOCK_D: tl.constexpr, COPIES: tl.constexpr,
                      PDL: tl.constexpr):
    pid = tl.program_id(0)
    t = tl.cast(pid, tl.int64)
    comb = comb_of(logits_ptr, t, hc_eps, iters, N)  # before the wait, as `_expand_kernel`
    pdl_enter(PDL)
    rd = tl.arange(0, BLOCK_D)
    d_ok = rd < D
    acc = exchange_row(x_ptr + t * stride_x, areas, seq_ptr, pid, D, rd, d_ok, RANK, WORLD,
                       PROGRAMS, BITS, COPIES)
    # the all-reduce's result in the streams' dtype, expanded as `_expand_kernel` does
    expand_columns(acc.to(new_ptr.dtype.element_ty), streams_ptr, post_ptr, comb, new_ptr,
                   t, rd, d_ok, stride_st, stride_sn, N, D)


def check_inputs(op: str, streams: torch.Tensor, partial: torch.Tensor, post: torch.Tensor,
                 comb_logits: torch.Tensor, areas: Sequence[torch.Tensor], seqs: torch.Tensor,
                 rank: int) -> None:
    """The shapes, dtypes and push memory a pushed hc_post takes (ValueError naming `op`)."""
    t, n, d = streams.shape
    world = len(areas)
    if (partial.shape != (t, d) or post.shape != (t, n) or comb_logits.shape != (t, n, n)
            or n & (n - 1) or partial.dtype != streams.dtype or partial.element_size() not in (2, 4)
            or not 0 <= rank < world or t > MAX_PROGRAMS):
        raise ValueError(f"{op}: need streams [T, N, D] (N a power of two), partial [T, D] of "
                         f"their dtype (16 or 32 bits), post [T, N], comb's [T, N, N], at most "
                         f"{MAX_PROGRAMS} rows, rank {rank} of {world}; got "
                         f"{tuple(streams.shape)}, {tuple(partial.shape)} {partial.dtype}, "
                         f"{tuple(post.shape)}, {tuple(comb_logits.shape)}")
    if areas[rank].numel() < area_elements(world, d) or seqs.numel() < MAX_PROGRAMS:
        raise ValueError(f"areas of {areas[rank].numel()} and counts of {seqs.numel()} are too "
                         f"small for {world} ranks of width {d}: see area_elements")


def hc_post_all_reduce_triton(streams: torch.Tensor, partial: torch.Tensor, post: torch.Tensor,
                              comb_logits: torch.Tensor, areas: Sequence[torch.Tensor],
                              seqs: torch.Tensor, rank: int, *, hc_eps: float,
                              sinkhorn_iters: int) -> torch.Tensor:
    """`hc_post_ref(streams, sum over the ranks of partial, post, comb_logits, ...)` in one
    launch: streams [T, N, D], this rank's partial [T, D] (its dtype; rows may be strided),
    post [T, N] and comb's logits [T, N, N] fp32 (hc_pre's) -> new streams [T, N, D].
    Collective: every rank calls it with the same shapes, in the same order, interleaved as it
    likes with the group's push calls on `areas` (every rank's landing area, rows as their
    signal: empty bytes `EMPTY_BYTE`) and `seqs` (this rank's call counts); T at most
    `MAX_PROGRAMS`."""
    check_inputs("hc_post_all_reduce", streams, partial, post, comb_logits, areas, seqs, rank)
    t, n, d = streams.shape
    world = len(areas)
    streams = streams if streams.stride(2) == 1 else streams.contiguous()
    partial = partial if partial.stride(1) == 1 else partial.contiguous()
    post, comb_logits = post.float().contiguous(), comb_logits.float().contiguous()
    new = torch.empty((t, n, d), dtype=streams.dtype, device=streams.device)
    if t == 0:
        return new
    block_d = triton.next_power_of_2(d)
    warps = max(4, min(16, n * block_d // 1024))
    _push_post_kernel[(t,)](
        partial, streams, post, comb_logits, new, tuple(areas), seqs, d, partial.stride(0),
        streams.stride(0), streams.stride(1), hc_eps, sinkhorn_iters, RANK=rank, WORLD=world,
        PROGRAMS=MAX_PROGRAMS,
        BITS=8 * partial.element_size(), N=n, BLOCK_D=block_d,
        COPIES=copies(block_d, warps), num_warps=warps, **pdl_launch(streams))
    return new


__all__ = ["EMPTY_BYTE", "hc_post_all_reduce_triton"]
