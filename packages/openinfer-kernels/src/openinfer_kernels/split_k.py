# mypy: disable-error-code="no-untyped-def"
"""A split-K launch's shares summed by its own last program (no second kernel): each program
stores its fp32 share, then counts itself in on its output block's arrival count; the one that
arrives last adds every share in share order (the bits a separate sum kernel gives) into the
output and puts the count back to 0, so the next launch, or a CUDA graph's replay, starts from
zero. The pattern of a semaphore: every thread's stores, a CTA barrier, then one atomic with
release and acquire at GPU scope (Triton issues a scalar atomic from one thread and hands its
result to all). `OPENINFER_SPLIT_SUM=kernel` keeps the second kernel instead (an A/B).
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import triton
import triton.language as tl

from openinfer_kernels.activation.triton import silu_mul

SPLIT_SUM_ENV = "OPENINFER_SPLIT_SUM"  # serial (default) | kernel; read once, at import
SERIAL_SUM = os.environ.get(SPLIT_SUM_ENV, "serial") != "kernel"
COUNTERS = 1 << 16  # output blocks one split launch may have (int32 counts, 256 KB a device)
_counters: dict[tuple[torch.device, int], torch.Tensor] = {}
_lane = 0  # the counts' set that launches take now (`lane`)


@contextmanager
def lane(n: int) -> Iterator[None]:
    """Launches made inside take counts set `n` (0 outside any): work on a side stream
    (`side_stream.beside`) takes a set of its own, since its launches may overlap the main
    stream's."""
    global _lane
    before, _lane = _lane, n
    try:
        yield
    finally:
        _lane = before


def split_counters(device: torch.device) -> torch.Tensor | None:
    """The arrival counts of split launches on `device` in the current `lane`, zeros between
    launches. Launches of one lane never overlap at the counts (a kernel touches them after
    `pdl_enter`, which waits for the kernel before it in its stream to finish, and the engine
    runs one step at a time), so one array a lane serves them all. Made on first use outside
    CUDA graph capture (the engine's eager warm-up comes first); None while a capture would
    have to make it."""
    counts = _counters.get((device, _lane))
    if counts is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        counts = _counters[device, _lane] = torch.zeros(COUNTERS, dtype=torch.int32,
                                                        device=device)
    return counts


def counts_for(device: torch.device, blocks: int) -> torch.Tensor | None:
    """The counts for a launch of `blocks` output blocks, or None where it must sum with a
    second kernel (too many blocks, or no counts yet inside a capture)."""
    return split_counters(device) if blocks <= COUNTERS else None


@triton.jit
def sum_if_last(part_ptr, final_ptr, count_ptr, rm, rn, mask, M, N, width, stride_om,
                 splits, GATED: tl.constexpr, M_PAD: tl.constexpr,
                 BLOCK_N: tl.constexpr, LIMIT: tl.constexpr = 0.0):
    """After this program stored its share of the output block at rows `rm`, columns `rn`
    (shares at part_ptr + (share * M + row) * width + column; `GATED`: the up column N past
    each, and silu(sum) * up-sum stored; LIMIT > 0: both clamped first, `silu_mul`): count
    it in at `count_ptr`; the block's last of `splits` shares sums them into `final_ptr` (row
    stride stride_om) and zeroes the count. Returns whether this program was that last one."""
    tl.debug_barrier()  # the whole share is stored before it is counted
    arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
    last = arrived == splits - 1
    if last:
        total = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
        up = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
        for s in range(splits):  # the other shares' rows come from L2 (.cg), never from a
            row = part_ptr + (s * M + rm[:, None]) * width  # stale line of this SM's L1
            total += tl.load(row + rn[None, :], mask=mask, other=0.0, cache_modifier=".cg")
            if GATED:
                up += tl.load(row + N + rn[None, :], mask=mask, other=0.0, cache_modifier=".cg")
        if GATED:
            total = silu_mul(total, up, final_ptr.dtype.element_ty, LIMIT)
        tl.store(final_ptr + rm[:, None] * stride_om + rn[None, :],
                 total.to(final_ptr.dtype.element_ty), mask=mask)
        tl.atomic_xchg(count_ptr, 0, sem="relaxed", scope="gpu")
    return last
