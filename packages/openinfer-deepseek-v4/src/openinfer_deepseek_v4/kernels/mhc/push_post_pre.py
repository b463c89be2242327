# mypy: disable-error-code="no-untyped-def"
"""One sublayer's `hc_post`, summed over the tensor-parallel ranks, and the next sublayer's
`hc_pre` in one launch, for a decode step of one token: at batch 1 the two launches
(`push_post.py`'s, then `_mix_kernel`) are two of a layer's ~20 kernels on the step's chain,
each held by its own latency, and the second only reads what the first wrote.

Program p of P (P = D / BLOCK_C, at most the push memory's rows) owns columns
[p BLOCK_C, (p + 1) BLOCK_C) of the token's row:
1. before its PDL wait, comb from the current hc_pre's logits (as `push_post.py`) and its share
   of the next mix weights fn[:, j D + c] for every stream j and its columns c (a weight);
2. its columns of this rank's partial row pushed into the peers' landing areas and read back
   summed (`exchange_row`, as row p of the group's push protocol: program p's call count,
   landing row p, these columns only; a slot is refilled only after its reader's launch that
   emptied it ended, whatever columns the calls between used; its 64 columns sit in 512
   threads, each held by several, so every copy reads the landed row: `take_landed`'s COPIES);
3. the new streams at its columns (`expand_columns`, stored), then their share of the next
   mix projection and sum of squares into an fp32 workspace;
4. the last program to arrive (`openinfer_kernels.split_k`'s arrival count) computes the
   token's mixing weights, collapse and norm from the P shares and the new streams
   (`token_weights`, read past L1), as the one-token `_mix_kernel` does.

The new streams are `hc_post_all_reduce`'s bits; the next x, post and comb's logits are
`hc_pre`'s up to the fp32 summation order of the mix projection (its shares split by columns
here, by stream there). (The mypy line above: @triton.jit functions annotate only their
constexpr parameters.)"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from openinfer_deepseek_v4.kernels.mhc.push_post import check_inputs
from openinfer_deepseek_v4.kernels.mhc.triton import comb_of, expand_columns, token_weights
from openinfer_kernels import split_k
from openinfer_kernels.collective.push_triton import EMPTY_BYTE, copies, exchange_row
from openinfer_kernels.collective.triton import MAX_PROGRAMS
from openinfer_kernels.pdl import pdl_enter, pdl_launch


@triton.jit
def _push_post_pre_kernel(x_ptr, streams_ptr, post_ptr, logits_ptr, new_ptr, areas, seq_ptr,
                          fn_ptr, part_ptr, ssq_ptr, count_ptr, base_ptr, scale_ptr,
                          norm_w_ptr, y_ptr, post2_ptr, logits2_ptr, D, stride_st, stride_sn,
                          hc_eps, iters, norm_eps, RANK: tl.constexpr, WORLD: tl.constexpr,
                          PROGRAMS: tl.constexpr, BITS: tl.constexpr, N: tl.constexpr,
                          M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_C: tl.constexpr,
                          SPLIT_PAD: tl.constexpr, BLOCK_D: tl.constexpr, COPIES: tl.constexpr,
                          PDL: tl.constexpr):
    pid = tl.program_id(0)
    cols = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = cols < D
    rn = tl.arange(0, N)
    rm = tl.arange(0, M_PAD)
    # before the wait: comb (the current hc_pre wrote its logits a kernel or more back) and
    # this program's columns of the next mix weights, [M_PAD, N, BLOCK_C]
    comb = comb_of(logits_ptr, 0, hc_eps, iters, N)
    k = rn[:, None] * D + cols[None, :]
    w = tl.load(fn_ptr + rm[:, None, None] * (N * D) + k[None, :, :],
                mask=(rm < M)[:, None, None] & ok[None, None, :], other=0.0).to(tl.float32)
    pdl_enter(PDL)
    acc = exchange_row(x_ptr, areas, seq_ptr, pid, D, cols, ok, RANK, WORLD, PROGRAMS, BITS,
                       COPIES)
    new = expand_columns(acc.to(new_ptr.dtype.element_ty), streams_ptr, post_ptr, comb, new_ptr,
                         0, cols, ok, stride_st, stride_sn, N, D)
    h = tl.where(ok[None, :], new.to(tl.float32), 0.0)  # [N, BLOCK_C], as stored
    part = tl.sum(tl.sum(w * h[None, :, :], axis=2), axis=1)
    tl.store(part_ptr + pid * M_PAD + rm, part)
    tl.store(ssq_ptr + pid, tl.sum(tl.sum(h * h, axis=1), axis=0))
    tl.debug_barrier()  # the whole share (and the new streams) stored before it is counted
    if tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        token_weights(pid * 0, new_ptr, part_ptr, ssq_ptr, base_ptr, scale_ptr, norm_w_ptr,
                       y_ptr, post2_ptr, logits2_ptr, 1, tl.num_programs(0), N * D, D, hc_eps,
                       norm_eps, N, D, M_PAD, SPLIT_PAD, BLOCK_D, False, True, ".cg")
        tl.atomic_xchg(count_ptr, 0, sem="relaxed", scope="gpu")


def column_block(d: int) -> int:
    """The columns a program owns: a power of two, at least 16, with at most MAX_PROGRAMS
    programs for the row (64 of 64 columns at V4-Flash's 4096)."""
    return max(16, triton.next_power_of_2(triton.cdiv(d, MAX_PROGRAMS)))


def hc_post_pre_all_reduce_triton(
        streams: torch.Tensor, partial: torch.Tensor, post: torch.Tensor,
        comb_logits: torch.Tensor, areas: Sequence[torch.Tensor], seqs: torch.Tensor,
        rank: int, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
        norm_weight: torch.Tensor, *, hc_eps: float, sinkhorn_iters: int, norm_eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """`hc_post_all_reduce_triton(streams, partial, post, comb_logits, ...)` then
    `hc_pre_triton` of its new streams with the next sublayer's fn [(2 + N) N, N D], base,
    scale and norm_weight, in one launch: (new streams [1, N, D], x [1, D], post [1, N],
    comb's logits [1, N, N]). One token only; None where it cannot run (more tokens, or no
    arrival counts inside a capture), and then nothing was done. Collective, as
    `hc_post_all_reduce_triton`."""
    t, n, d = streams.shape
    m = (2 + n) * n
    if t != 1:
        return None
    check_inputs("hc_post_pre_all_reduce", streams, partial, post, comb_logits, areas, seqs,
                 rank)
    if fn.shape != (m, n * d) or base.shape != (m,) or norm_weight.shape != (d,):
        raise ValueError(f"hc_post_pre_all_reduce: need the next sublayer's fn [(2 + N) N, N D], "
                         f"base [(2 + N) N] and norm_weight [D]; got {tuple(fn.shape)}, "
                         f"{tuple(base.shape)}, {tuple(norm_weight.shape)}")
    counts = split_k.counts_for(streams.device, 1)
    if counts is None:
        return None
    device = streams.device
    streams = streams if streams.stride(2) == 1 else streams.contiguous()
    partial = partial if partial.stride(1) == 1 else partial.contiguous()
    post, comb_logits = post.float().contiguous(), comb_logits.float().contiguous()
    block_c = column_block(d)
    programs = triton.cdiv(d, block_c)
    m_pad = max(16, triton.next_power_of_2(m))
    new = torch.empty((t, n, d), dtype=streams.dtype, device=device)
    y = torch.empty((t, d), dtype=streams.dtype, device=device)
    post2 = torch.empty((t, n), dtype=torch.float32, device=device)
    logits2 = torch.empty((t, n, n), dtype=torch.float32, device=device)
    part = torch.empty((programs, m_pad), dtype=torch.float32, device=device)
    ssq = torch.empty((programs,), dtype=torch.float32, device=device)
    block_d = triton.next_power_of_2(d)
    warps = max(4, min(16, n * block_d // 1024))  # the last program's [N, D] row
    _push_post_pre_kernel[(programs,)](
        partial, streams, post, comb_logits, new, tuple(areas), seqs, fn.contiguous(), part, ssq,
        counts, base.float().contiguous(), scale.float().contiguous(), norm_weight, y, post2,
        logits2, d, streams.stride(0), streams.stride(1), hc_eps, sinkhorn_iters, norm_eps,
        RANK=rank, WORLD=len(areas), PROGRAMS=MAX_PROGRAMS, BITS=8 * partial.element_size(), N=n,
        M=m, M_PAD=m_pad, BLOCK_C=block_c, SPLIT_PAD=triton.next_power_of_2(programs),
        BLOCK_D=block_d, COPIES=copies(block_c, warps), num_warps=warps, **pdl_launch(streams))
    return new, y, post2, logits2


__all__ = ["EMPTY_BYTE", "column_block", "hc_post_pre_all_reduce_triton"]
