# mypy: disable-error-code="no-untyped-def"
"""The merge of split-context attention (flash-decoding): each split's partial output and
log-sum-exp, [T, Hq, splits, BLOCK_D] and [T, Hq, splits] fp32, weighed into one output.
Either `merge_kernel`, launched after the split kernel, or inside the split kernel itself for
decode steps (`fused_decode_merge`): each split program raises an arrival counter of its
(request, kv head) once its partials are stored, and the last to arrive merges
(`merge_if_last`), which saves the second launch.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from openinfer_kernels.pdl import pdl_enter

# Decode steps merge their splits inside the split kernel: one launch instead of two. Off until
# measured on the H100 (benchmarks/device/decode_merge.py, then batch-1 TPOT with
# OPENINFER_DECODE_MERGE=fused against =separate, which override this default).
FUSED_DECODE_MERGE = False
_MERGE_CHOICE = os.environ.get("OPENINFER_DECODE_MERGE") or None
if _MERGE_CHOICE not in (None, "fused", "separate"):
    raise ValueError(f"OPENINFER_DECODE_MERGE must be 'fused' or 'separate', not "
                     f"{_MERGE_CHOICE!r}")
# The fused merge's arrival counters, one per (request, kv head) of a launch, at most this many.
MERGE_COUNTERS = 1 << 16


def fused_decode_merge() -> bool:
    """Whether decode steps merge their splits inside the split kernel by default:
    OPENINFER_DECODE_MERGE when set, else `FUSED_DECODE_MERGE`."""
    return FUSED_DECODE_MERGE if _MERGE_CHOICE is None else _MERGE_CHOICE == "fused"


# One zeroed buffer per device: the merging program of each (request, kv head) resets its
# counter, so between launches every counter is 0 and all layers, steps and CUDA-graph replays
# share it. That needs the launches on a device ordered, one after another, as the engine's
# are (one stream).
_counters: dict[torch.device, torch.Tensor] = {}


def merge_counters(device: torch.device) -> torch.Tensor:
    """The fused decode merge's arrival counters on `device` ([MERGE_COUNTERS] int32, zero
    between launches), allocated on first use: before CUDA-graph capture, as the warm-up that
    precedes a capture makes it."""
    counters = _counters.get(device)
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the fused decode merge's counters are allocated on first use, "
                               "which must not be inside a CUDA-graph capture: run the step "
                               "once before capturing it")
        counters = torch.zeros(MERGE_COUNTERS, dtype=torch.int32, device=device)
        _counters[device] = counters
    return counters


@triton.jit
def merge_partials(part_out_ptr, part_lse_ptr, rows, r_mask, offs_d, d_mask, num_splits,
                   R: tl.constexpr, BLOCK_D: tl.constexpr):
    """The splits' partial outputs of `rows` (token * Hq + head) weighed by their log-sum-exp,
    as `merge_kernel` weighs them: [R, BLOCK_D] fp32. Other programs wrote them during this
    launch: the loads go to L2 (.cg), past this SM's L1."""
    base = rows * num_splits
    lse_max = tl.full([R], -1e30, tl.float32)  # all splits empty: weights 0, output 0
    for s in range(num_splits):
        lse = tl.load(part_lse_ptr + base + s, mask=r_mask, other=float("-inf"),
                      cache_modifier=".cg")
        lse_max = tl.maximum(lse_max, lse)
    total = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, BLOCK_D], tl.float32)
    for s in range(num_splits):
        lse = tl.load(part_lse_ptr + base + s, mask=r_mask, other=float("-inf"),
                      cache_modifier=".cg")
        weight = tl.exp2(lse - lse_max)
        part = tl.load(part_out_ptr + (base + s)[:, None] * BLOCK_D + offs_d[None, :],
                       mask=r_mask[:, None] & d_mask[None, :], other=0.0, cache_modifier=".cg")
        total += weight
        acc += weight[:, None] * part
    return acc / tl.where(total == 0.0, 1.0, total)[:, None]


@triton.jit
def merge_if_last(counter_ptr, part_out_ptr, part_lse_ptr, out_ptrs, rows, r_mask, offs_d,
                  d_mask, num_splits, R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Count this program's partials in; the last of the `num_splits` programs sharing
    `counter_ptr` to arrive merges them all into `out_ptrs` and resets the count to 0 for the
    next launch (a CUDA graph replays this one). Memory order: every thread's partials are
    stored before the barrier, after which one thread raises the count with release semantics
    at GPU scope; the acquire half of the same atomic, then a barrier, come before the merge
    reads the others' partials."""
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == num_splits - 1:
        tl.debug_barrier()
        out = merge_partials(part_out_ptr, part_lse_ptr, rows, r_mask, offs_d, d_mask,
                             num_splits, R, BLOCK_D)
        tl.store(out_ptrs, out.to(out_ptrs.dtype.element_ty),
                 mask=r_mask[:, None] & d_mask[None, :])
        tl.store(counter_ptr, 0)


@triton.jit
def zero_if_unowned(out_ptr, query_start_loc_ptr, token, kv_head, num_seqs, num_tokens,
                    stride_ot, stride_oh, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    """Zeros into `token`'s heads of this kv head when no request owns the token (padding of a
    CUDA graph's bucket), as `merge_kernel` writes them."""
    g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    unowned = (token >= tl.load(query_start_loc_ptr + num_seqs)) & (token < num_tokens)
    mask = (g < tl.where(unowned, GROUP, 0))[:, None] & (offs_d < HEAD_DIM)[None, :]
    ptrs = (out_ptr + token.to(tl.int64) * stride_ot + (kv_head * GROUP + g)[:, None] * stride_oh
            + offs_d[None, :])
    tl.store(ptrs, tl.zeros([BLOCK_G, BLOCK_D], tl.float32).to(out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit(do_not_specialize=["num_seqs", "num_splits"])
def merge_kernel(
    query_start_loc_ptr, part_out_ptr, part_lse_ptr, out_ptr, num_seqs, num_splits, stride_ot,
    stride_oh, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    token = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    out_ptrs = out_ptr + token.to(tl.int64) * stride_ot + head * stride_oh + offs_d
    if token >= tl.load(query_start_loc_ptr + num_seqs):
        # Padding past the requests' tokens (a CUDA graph's bucket): no split wrote it.
        tl.store(out_ptrs, tl.zeros([BLOCK_D], tl.float32).to(out_ptr.dtype.element_ty),
                 mask=d_mask)
        return
    s_mask = offs_s < num_splits
    part = (token.to(tl.int64) * tl.num_programs(1) + head) * num_splits + offs_s
    lse = tl.load(part_lse_ptr + part, mask=s_mask, other=float("-inf"))
    # All splits empty (a zero-length context): weights 0 everywhere, output 0, not NaN.
    lse_max = tl.maximum(tl.max(lse, 0), -1e30)
    weight = tl.exp2(lse - lse_max)
    parts = tl.load(part_out_ptr + part[:, None] * BLOCK_D + offs_d[None, :],
                    mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    total = tl.sum(weight, 0)
    out = tl.sum(weight[:, None] * parts, 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=d_mask)
