# mypy: disable-error-code="no-untyped-def"
"""One-shot all-reduce + residual add + RMSNorm in one Triton kernel over torch's symmetric
memory (`torch.distributed._symmetric_memory`): every rank's staging buffer and signal pad are
mapped into every other rank's address space, so a program reads its peers' rows directly
(NVLink) and needs no NVLink multicast.

Each program takes rows pid, pid + programs, ... and, on every rank alike:
1. copies this rank's rows of `x` into this rank's buffer;
2. meets the same program of every peer (`_blockwise_barrier`): the peers' copies of those rows
   are then visible;
3. sums each row over the ranks in fp32, in rank order (so every rank gets the same bits),
   rounds the sum to the stream's dtype as an all-reduce would hand it over, and adds the
   residual and normalizes as `fused_add_rms_norm` does (`norm.triton._add_rms_norm_row`);
4. meets the peers' program again before returning: no rank writes its buffer in a later
   collective while a peer still reads it.

The barrier uses the signal pad's slots as torch's own symmetric-memory kernels do (slot
`program * world + rank` on the peer's pad; CAS 0 -> 1 to signal, 1 -> 0 to consume), so its
flags and theirs pair up in stream order on the same pads and every slot is 0 again after each
kernel: the kernel can be captured in a CUDA graph and replayed. Program p on one rank waits
for program p on the others, so all programs must be resident at once: at most `MAX_PROGRAMS`
(and one slot per rank and program on the pad).

A scalar `tl.atomic_cas` is executed by one thread of the program and its result broadcast to
the others through shared memory (Triton's lowering of a scalar atomic), so the spin loops
below run once per program with a uniform condition. `tl.debug_barrier()` (bar.sync) orders
the program's own stores before the release and its loads after the acquire, the pattern of
torch's `sync_remote_blocks`.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from openinfer_kernels.norm.triton import _add_rms_norm_row, row_settings
from openinfer_kernels.pdl import pdl_enter, pdl_launch

# Programs per launch at most: all of them must be resident together (132 SMs on an H100), and
# 64 programs of 8 ranks fill the 2 KB signal pad torch gives each rank.
MAX_PROGRAMS = 64


@triton.jit
def _blockwise_barrier(pads, slot, RANK: tl.constexpr, WORLD: tl.constexpr):
    # Signal every peer at `slot + RANK` of its pad, then consume each peer's signal at
    # `slot + peer` of this rank's own pad. A signal waits for the slot to be free (the
    # previous one consumed), so consecutive barriers pair up in order. With WORLD == 1 there
    # is no peer and nothing to wait for.
    tl.debug_barrier()
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            while tl.atomic_cas(pads[peer] + slot + RANK, 0, 1, sem="release",
                                scope="sys") != 0:
                pass
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            while tl.atomic_cas(pads[RANK] + slot + peer, 1, 0, sem="acquire",
                                scope="sys") != 1:
                pass
    tl.debug_barrier()


@triton.jit
def _all_reduce_add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, bufs, pads, T, H,
                                    x_row_stride, res_row_stride, eps, RANK: tl.constexpr,
                                    WORLD: tl.constexpr, BLOCK_H: tl.constexpr,
                                    PDL: tl.constexpr):
    # bufs, pads: every rank's symmetric buffer (rows of H, in x's dtype) and signal pad
    # (int32), in rank order, as this rank maps them.
    pdl_enter(PDL)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    slot = pid * WORLD
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    for row in range(pid, T, programs):
        r64 = tl.cast(row, tl.int64)
        x = tl.load(x_ptr + r64 * x_row_stride + cols, mask=mask)
        tl.store(bufs[RANK] + r64 * H + cols, x, mask=mask)
    _blockwise_barrier(pads, slot, RANK, WORLD)
    for row in range(pid, T, programs):
        r64 = tl.cast(row, tl.int64)
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for peer in tl.static_range(WORLD):
            if peer == RANK:  # this rank's own rows, from x (the same values as its buffer)
                part = tl.load(x_ptr + r64 * x_row_stride + cols, mask=mask, other=0.0)
            else:  # a peer's, written by another GPU during this kernel: never from a cache
                part = tl.load(bufs[peer] + r64 * H + cols, mask=mask, other=0.0,
                               volatile=True)
            acc += part.to(tl.float32)
        # Rounded as the all-reduce's output would be, then the unfused path's add + norm.
        s = acc.to(sum_ptr.dtype.element_ty).to(tl.float32)
        r = tl.load(res_ptr + r64 * res_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        _add_rms_norm_row(s, r, w_ptr, out_ptr, sum_ptr, r64, H, eps, cols, mask, True)
    _blockwise_barrier(pads, slot, RANK, WORLD)


def all_reduce_add_rms_norm_triton(x: torch.Tensor, residual: torch.Tensor,
                                   weight: torch.Tensor, eps: float,
                                   buffers: Sequence[torch.Tensor], pads: Sequence[torch.Tensor],
                                   rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(s + residual) * weight, s + residual), `s` the sum of `x` [..., H] over the
    ranks (`reference.all_reduce_add_rms_norm_ref`), in new tensors. Collective: every rank
    calls it with the same shapes, in the same order as its other symmetric-memory
    collectives. `buffers` / `pads`: every rank's symmetric buffer viewed as x's dtype (at least
    x.numel() elements) and its signal pad as int32 (zeros between collectives), in rank
    order; `rank`: this rank's index in them."""
    world = len(buffers)
    if len(pads) != world or not 0 <= rank < world:
        raise ValueError(f"{world} buffers, {len(pads)} signal pads, rank {rank}")
    h = x.shape[-1]
    rows = x.reshape(-1, h).contiguous()
    res = residual.reshape(-1, h)
    res = res if res.stride(-1) == 1 else res.contiguous()
    t = rows.shape[0]
    if rows.numel() > buffers[rank].numel():
        raise ValueError(f"{t} rows of {h} do not fit the symmetric buffer "
                         f"({buffers[rank].numel()} elements)")
    normed = torch.empty_like(rows)
    summed = torch.empty_like(rows)
    if t:
        block, num_warps = row_settings(h)
        programs = min(t, MAX_PROGRAMS, pads[rank].numel() // world)
        _all_reduce_add_rms_norm_kernel[(programs,)](
            rows, res, weight, normed, summed, tuple(buffers), tuple(pads), t, h,
            rows.stride(0), res.stride(0), eps, RANK=rank, WORLD=world, BLOCK_H=block,
            num_warps=num_warps, **pdl_launch(x))
    return normed.view(x.shape), summed.view(x.shape)
