# mypy: disable-error-code="no-untyped-def"
"""A step's slot arithmetic in one Triton launch per table (`reference.py` says what each
computes; the model's `StepSlots` makes each once a step). In torch ops each is a chain of 4
to 23 small launches (the index, the divisions, the comparisons, the wheres, the casts), about
60 a decode step of DeepSeek-V4-Flash; here 5. Integer arithmetic only: the same values as the
references. (The mypy line above: @triton.jit functions annotate only their constexpr
parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_kernels.pdl import pdl_enter, pdl_launch

BLOCK_T = 128  # tokens a program of the per-token kernels
BLOCK_W = 256  # columns a program of the per-query tables
BLOCK_B = 64  # requests a step of the token -> request search


@triton.jit
def _requests_kernel(qsl_ptr, out_ptr, T, B, BLOCK_T: tl.constexpr, BLOCK_B: tl.constexpr,
                     PDL: tl.constexpr):
    # A token's request: how many requests end at or before it (query_start_loc[1:] <= t),
    # the last request's for tokens past every request (a CUDA graph's padding).
    pdl_enter(PDL)
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    owner = tl.zeros([BLOCK_T], dtype=tl.int32)
    for b in range(0, B, BLOCK_B):
        rb = b + tl.arange(0, BLOCK_B)
        ends = tl.load(qsl_ptr + 1 + rb, mask=rb < B, other=2147483647)
        owner += tl.sum((ends[None, :] <= rt[:, None]).to(tl.int32), axis=1)
    tl.store(out_ptr + rt, tl.minimum(owner, tl.maximum(B - 1, 0)), mask=rt < T)


@triton.jit
def _token_slots_kernel(table_ptr, stride_tb, stride_tc, req_ptr, pos_ptr, slot_ptr, out_ptr, T,
                        block_size, BLOCK_T: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = rt < T
    r = tl.load(req_ptr + rt, mask=ok, other=0).to(tl.int64)
    p = tl.load(pos_ptr + rt, mask=ok, other=0).to(tl.int64)
    full = tl.load(slot_ptr + rt, mask=ok, other=0).to(tl.int64)
    block = tl.load(table_ptr + r * stride_tb + (p // block_size) * stride_tc, mask=ok,
                    other=0).to(tl.int64)
    slots = tl.where(full < block_size, full, block * block_size + p % block_size)
    tl.store(out_ptr + rt, slots, mask=ok)


@triton.jit
def _window_kernel(table_ptr, stride_tb, stride_tc, req_ptr, pos_ptr, out_ptr, size, block_size,
                   BLOCK_W: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    t = tl.program_id(0)
    j = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    ok = j < size
    r = tl.load(req_ptr + t).to(tl.int64)
    window = tl.load(pos_ptr + t).to(tl.int64) - size + 1 + j
    real = window >= 0
    window = tl.maximum(window, 0)
    block = tl.load(table_ptr + r * stride_tb + (window // block_size) * stride_tc,
                    mask=ok & real, other=0).to(tl.int64)
    slots = tl.where(real, block * block_size + window % block_size, -1)
    tl.store(out_ptr + t.to(tl.int64) * size + j, slots.to(tl.int32), mask=ok)


@triton.jit
def _entry_slots(row_ptr, stride_tc, max_blocks, entries, ok, ratio, block_size,
                 slots_per_block):
    """The pool rows of `entries` (-1: none) of one request whose table row is at row_ptr:
    entry j sits in the block of token (j + 1) * ratio - 1 (`paged_entry_slots`)."""
    last = (tl.maximum(entries, 0) + 1) * ratio - 1
    column = tl.minimum(last // block_size, max_blocks - 1)
    block = tl.load(row_ptr + column * stride_tc, mask=ok & (entries >= 0),
                    other=0).to(tl.int64)
    slots = block * slots_per_block + (last % block_size) // ratio
    return tl.where(entries >= 0, slots, -1).to(tl.int32)


@triton.jit
def _visible_kernel(table_ptr, stride_tb, stride_tc, max_blocks, req_ptr, pos_ptr, out_ptr,
                    width, ratio, block_size, slots_per_block, BLOCK_W: tl.constexpr,
                    PDL: tl.constexpr):
    pdl_enter(PDL)
    t = tl.program_id(0)
    j = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W).to(tl.int64)
    ok = j < width
    r = tl.load(req_ptr + t).to(tl.int64)
    seen = (tl.load(pos_ptr + t).to(tl.int64) + 1) // ratio
    entries = tl.where(j < seen, j, -1)
    slots = _entry_slots(table_ptr + r * stride_tb, stride_tc, max_blocks, entries, ok, ratio,
                         block_size, slots_per_block)
    tl.store(out_ptr + t.to(tl.int64) * width + j, slots, mask=ok)


@triton.jit
def _closed_kernel(table_ptr, stride_tb, stride_tc, max_blocks, req_ptr, pos_ptr, out_ptr, T,
                   ratio, block_size, slots_per_block, BLOCK_T: tl.constexpr,
                   PDL: tl.constexpr):
    pdl_enter(PDL)
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = rt < T
    r = tl.load(req_ptr + rt, mask=ok, other=0).to(tl.int64)
    p = tl.load(pos_ptr + rt, mask=ok, other=0).to(tl.int64)
    entries = tl.where((p + 1) % ratio == 0, (p + 1) // ratio - 1, -1)
    slots = _entry_slots(table_ptr + r * stride_tb, stride_tc, max_blocks, entries, ok, ratio,
                         block_size, slots_per_block)
    tl.store(out_ptr + rt, slots, mask=ok)


def token_requests_triton(query_start_loc: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """`token_requests`' contract (kernels/indexer/reference.py) in one launch."""
    out = torch.empty(num_tokens, dtype=torch.int32, device=query_start_loc.device)
    if num_tokens:
        _requests_kernel[(triton.cdiv(num_tokens, BLOCK_T),)](
            query_start_loc, out, num_tokens, query_start_loc.shape[0] - 1, BLOCK_T=BLOCK_T,
            BLOCK_B=BLOCK_B, **pdl_launch(out))
    return out


def token_slots_triton(table: torch.Tensor, requests: torch.Tensor, positions: torch.Tensor,
                       slot_mapping: torch.Tensor, block_size: int) -> torch.Tensor:
    """`token_slots_ref` in one launch."""
    t = positions.shape[0]
    out = torch.empty(t, dtype=torch.int64, device=positions.device)
    if t:
        _token_slots_kernel[(triton.cdiv(t, BLOCK_T),)](
            table, table.stride(0), table.stride(1), requests, positions, slot_mapping, out, t,
            block_size, BLOCK_T=BLOCK_T, **pdl_launch(out))
    return out


def window_slots_triton(table: torch.Tensor, requests: torch.Tensor, positions: torch.Tensor,
                        size: int, block_size: int) -> torch.Tensor:
    """`window_slots_ref` in one launch."""
    t = positions.shape[0]
    out = torch.empty((t, size), dtype=torch.int32, device=positions.device)
    if t and size:
        _window_kernel[(t, triton.cdiv(size, BLOCK_W))](
            table, table.stride(0), table.stride(1), requests, positions, out, size,
            block_size, BLOCK_W=BLOCK_W, **pdl_launch(out))
    return out


def visible_entry_slots_triton(table: torch.Tensor, requests: torch.Tensor,
                               positions: torch.Tensor, width: int, *, ratio: int,
                               block_size: int, slots_per_block: int) -> torch.Tensor:
    """`visible_entry_slots_ref` in one launch."""
    t = positions.shape[0]
    out = torch.empty((t, width), dtype=torch.int32, device=positions.device)
    if t and width:
        _visible_kernel[(t, triton.cdiv(width, BLOCK_W))](
            table, table.stride(0), table.stride(1), table.shape[1], requests, positions, out,
            width, ratio, block_size, slots_per_block, BLOCK_W=BLOCK_W, **pdl_launch(out))
    return out


def closed_entry_slots_triton(table: torch.Tensor, requests: torch.Tensor,
                              positions: torch.Tensor, *, ratio: int, block_size: int,
                              slots_per_block: int) -> torch.Tensor:
    """`closed_entry_slots_ref` in one launch."""
    t = positions.shape[0]
    out = torch.empty(t, dtype=torch.int32, device=positions.device)
    if t:
        _closed_kernel[(triton.cdiv(t, BLOCK_T),)](
            table, table.stride(0), table.stride(1), table.shape[1], requests, positions, out,
            t, ratio, block_size, slots_per_block, BLOCK_T=BLOCK_T, **pdl_launch(out))
    return out
