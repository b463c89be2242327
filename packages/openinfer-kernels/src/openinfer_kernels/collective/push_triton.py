# mypy: disable-error-code="no-untyped-def"
"""All-reduce + residual add + RMSNorm for a decode step's few rows, pushing instead of
pulling: each rank writes its partial row straight into every peer's memory and raises a flag
there, so a rank waits one NVLink crossing (its peers' writes landing) and then reads only its
own memory. `triton.py`'s one-shot kernel pulls: a compare-and-swap round trip to meet the
peers, remote reads, and a second meeting before it returns.

The memory is a symmetric region of its own, every rank's mapped into every other's:
- `areas[r]`: rank r's landing area, [2 parities][world writers][MAX_PROGRAMS][H] in x's dtype;
- `flags[r]`: int32 [MAX_PROGRAMS][world], flags[r][p][q] the last call whose row rank q's
  program p has written into rank r's area;
- `seqs`: this rank's own int32 [MAX_PROGRAMS], how many calls each program has served.

One program per row (at most `MAX_PROGRAMS` rows), so program p of every rank serves row p, and
the flags count calls per program: call n of program p (n = seqs[p] + 1, the same on every
rank, since every rank makes the same calls) writes parity n % 2 of its slot in each peer's
area, then sets the peer's flag to n (release, system scope), waits until its own flags from
every peer reach n (acquire), and reads the peers' rows from its own area. The flags only grow,
so nothing is reset and the kernel replays in CUDA graphs. No meeting at the end: a writer
reuses a parity at call n + 2 only after its own call n + 1 saw the reader's flag n + 1, which
the reader raises after it has read call n.

With `signal="data"` (the default; `OPENINFER_TP_PUSH_SIGNAL=flags` keeps the flags above) the rows
are their own flags, as in TensorRT-LLM's Lamport all-reduce (on 4 H200s, one row of 4096: 5.2 us
against the flags' 7.6, `benchmarks/device/add_norm.py`): a landing slot holds all-ones bits (a
NaN) while empty, a writer stores its row there (a row value with those bits is stored as another
NaN), the reader polls its own memory until no element of the row is empty, adds it, and empties
the slot again for the call two later. No flag, no release fence: one NVLink crossing of the data
itself. A slot is refilled only after its reader emptied it: a writer's call n + 2 follows its call
n + 1, which waited for the reader's row of call n + 1, which the reader pushes in a later launch
than the one that emptied the slot (after `pdl_enter`, so after that launch ended).

The sum runs in fp32 in rank order and is rounded to x's dtype before the add and the norm,
as `triton.py` does, so both kernels (and the reference) give the same bits.

With `OPENINFER_PDL_PRELOAD=push` (`pdl.preloads`) the data-signalled add-norm kernel reads the
residual row and the norm weight before its PDL wait, so those reads overlap the linear before
it rather than follow the peers' rows: the residual must then not be written by the kernel
launched just before the all-reduce (in a decoder it is the last add-norm's sum, a sublayer
earlier; the linear before writes x).
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from openinfer_kernels.collective.triton import MAX_PROGRAMS
from openinfer_kernels.norm.triton import _add_rms_norm_row, row_settings
from openinfer_kernels.pdl import pdl_enter, pdl_launch, preloads

SIGNAL_ENV = "OPENINFER_TP_PUSH_SIGNAL"  # data (default) | flags; read when the module loads
SIGNALS = ("flags", "data")
EMPTY_BYTE = 0xFF  # every byte of an empty slot, with signal="data": all-ones, a NaN
PRELOAD = preloads("push")  # OPENINFER_PDL_PRELOAD names it; read once


def push_signal() -> str:
    """`OPENINFER_TP_PUSH_SIGNAL`: how a pushed row says it landed."""
    signal = os.environ.get(SIGNAL_ENV, "data")
    if signal not in SIGNALS:
        raise ValueError(f"{SIGNAL_ENV}={signal!r}: use flags or data")
    return signal


def area_elements(world: int, hidden: int) -> int:
    """The elements of one rank's landing area: 2 parities x `world` writers x `MAX_PROGRAMS`
    rows of `hidden`."""
    return 2 * world * MAX_PROGRAMS * hidden


def flag_slots(world: int) -> int:
    """The int32 flags of one rank: one per program and writer."""
    return MAX_PROGRAMS * world


@triton.jit
def count_call(count_ptr):
    """This program's call number (1 at the first call), counted in at `count_ptr`."""
    seq = tl.load(count_ptr) + 1
    tl.debug_barrier()  # every thread has read the count before it moves on
    tl.store(count_ptr, seq)
    return seq


@triton.jit
def _push_add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, areas, flags, seq_ptr,
                              H, x_row_stride, res_row_stride, eps, RANK: tl.constexpr,
                              WORLD: tl.constexpr, PROGRAMS: tl.constexpr,
                              BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    # areas, flags: every rank's landing area (x's dtype) and flags (int32), in rank order.
    pdl_enter(PDL)
    pid = tl.program_id(0)
    row = tl.cast(pid, tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    seq = count_call(seq_ptr + pid)
    parity = tl.cast(seq % 2, tl.int64)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask)
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            mine = ((parity * WORLD + RANK) * PROGRAMS + row) * H
            tl.store(areas[peer] + mine + cols, x, mask=mask)
    tl.debug_barrier()  # the whole row is written before a flag says so
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            tl.atomic_xchg(flags[peer] + pid * WORLD + RANK, seq, sem="release", scope="sys")
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            while tl.atomic_add(flags[RANK] + pid * WORLD + peer, 0, sem="acquire",
                                scope="sys") < seq:
                pass
    tl.debug_barrier()  # no thread reads the peers' rows before the flags said they landed
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for peer in tl.static_range(WORLD):
        if peer == RANK:
            acc += x.to(tl.float32)
        else:  # written by another GPU: never from a cache
            theirs = ((parity * WORLD + peer) * PROGRAMS + row) * H
            acc += tl.load(areas[RANK] + theirs + cols, mask=mask, other=0.0,
                           volatile=True).to(tl.float32)
    s = acc.to(sum_ptr.dtype.element_ty).to(tl.float32)
    r = tl.load(res_ptr + row * res_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    _add_rms_norm_row(s, r, w_ptr, out_ptr, sum_ptr, row, H, eps, cols, mask, True)


@triton.jit
def pushed(x, BITS: tl.constexpr):
    """x as a data-signalled row carries it: a value with the empty mark's bits (all ones) as
    another NaN, so no landed value reads as empty."""
    bits_type = tl.int16 if BITS == 16 else tl.int32
    nan = 0x7FFF if BITS == 16 else 0x7FFFFFFF  # a NaN that is not the empty mark
    x_bits = x.to(bits_type, bitcast=True)
    return tl.where(x_bits == -1, nan, x_bits).to(bits_type).to(x.dtype, bitcast=True)


@triton.jit
def take_landed(slot, mask, BITS: tl.constexpr, COPIES: tl.constexpr = False):
    """The row at `slot` (written by another GPU), polled past the caches until no value is
    the empty mark; the slot is then emptied again for its next use. COPIES: the row has
    fewer values than the program has threads, so the layout holds each value in several
    threads, and the loop's count saw one copy of each (another copy, loaded a moment
    earlier, may still hold the empty mark): every thread then reads the landed row again
    before it is emptied. `copies` says when."""
    bits_type = tl.int16 if BITS == 16 else tl.int32
    theirs = tl.load(slot, mask=mask, other=0.0, volatile=True)
    waiting = tl.sum(((theirs.to(bits_type, bitcast=True) == -1) & mask).to(tl.int32))
    while waiting > 0:
        theirs = tl.load(slot, mask=mask, other=0.0, volatile=True)
        waiting = tl.sum(((theirs.to(bits_type, bitcast=True) == -1) & mask).to(tl.int32))
    if COPIES:
        theirs = tl.load(slot, mask=mask, other=0.0, volatile=True)
        tl.debug_barrier()  # every copy read before the slot is emptied
    # The loop's sum needed every thread's last read: the slot is read out.
    tl.store(slot, tl.full(theirs.shape, -1, bits_type).to(theirs.dtype, bitcast=True),
             mask=mask)
    return theirs


def copies(values: int, num_warps: int) -> bool:
    """Whether a program of `num_warps` warps holds each of a row's `values` (a power of two)
    in several threads: `take_landed`'s COPIES."""
    return values < 32 * num_warps


@triton.jit
def exchange_row(x_row, areas, seq_ptr, pid, H, cols, mask, RANK: tl.constexpr,
                 WORLD: tl.constexpr, PROGRAMS: tl.constexpr, BITS: tl.constexpr,
                 COPIES: tl.constexpr = False):
    """Program `pid`'s row at `x_row` (columns `cols` where `mask`) pushed into every peer's
    landing area, and the ranks' rows summed in fp32 in rank order once landed (the slots
    emptied again): the data-signalled protocol of this module, for program pid's next call
    (its count at seq_ptr + pid). Any kernel that pushes rows this way interleaves with these
    on the same memory. COPIES: `take_landed`'s."""
    return exchange_values(tl.load(x_row + cols, mask=mask), areas, seq_ptr, pid, H, cols,
                           mask, RANK, WORLD, PROGRAMS, BITS, COPIES)


@triton.jit
def exchange_values(x, areas, seq_ptr, pid, H, cols, mask, RANK: tl.constexpr,
                    WORLD: tl.constexpr, PROGRAMS: tl.constexpr, BITS: tl.constexpr,
                    COPIES: tl.constexpr = False):
    """`exchange_row` of the row's values `x` (in the landing areas' dtype) rather than its
    address."""
    seq = count_call(seq_ptr + pid)
    parity = tl.cast(seq % 2, tl.int64)
    row = tl.cast(pid, tl.int64)
    sent = pushed(x, BITS)
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            mine = ((parity * WORLD + RANK) * PROGRAMS + row) * H
            tl.store(areas[peer] + mine + cols, sent, mask=mask)
    acc = tl.zeros(cols.shape, dtype=tl.float32)
    for peer in tl.static_range(WORLD):
        if peer == RANK:
            acc += x.to(tl.float32)
        else:
            slot = areas[RANK] + ((parity * WORLD + peer) * PROGRAMS + row) * H + cols
            acc += take_landed(slot, mask, BITS, COPIES).to(tl.float32)
    return acc


@triton.jit
def _push_data_add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, areas, seq_ptr, H,
                                   x_row_stride, res_row_stride, eps, RANK: tl.constexpr,
                                   WORLD: tl.constexpr, PROGRAMS: tl.constexpr,
                                   BITS: tl.constexpr, BLOCK_H: tl.constexpr,
                                   PDL: tl.constexpr, ADD_NORM: tl.constexpr = True,
                                   SHARES: tl.constexpr = 0, share_stride=0,
                                   PRELOAD: tl.constexpr = False, COPIES: tl.constexpr = False):
    # areas: every rank's landing area (sum_ptr's dtype), in rank order; empty slots all-ones
    # bits. ADD_NORM False: the sum alone, into sum_ptr (res_ptr, w_ptr and out_ptr unused).
    # SHARES > 0: x is that many fp32 split-K shares of the rank's row, share_stride apart,
    # summed here in share order and rounded as the linear's own sum would be. PRELOAD: the
    # residual row and the norm weight are read before the wait.
    pid = tl.program_id(0)
    row = tl.cast(pid, tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    if ADD_NORM and PRELOAD:
        # Before the wait, so they arrive while the peers' rows are on their way: the residual
        # row (the stream's last add-norm wrote it, kernels ago: see the module's note) and the
        # norm weight.
        r = tl.load(res_ptr + row * res_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    pdl_enter(PDL)
    if SHARES > 0:
        part = tl.zeros([BLOCK_H], dtype=tl.float32)
        for s in tl.static_range(SHARES):
            part += tl.load(x_ptr + s * share_stride + row * x_row_stride + cols, mask=mask,
                            other=0.0)
        acc = exchange_values(part.to(sum_ptr.dtype.element_ty), areas, seq_ptr, pid, H, cols,
                              mask, RANK, WORLD, PROGRAMS, BITS, COPIES)
    else:
        acc = exchange_row(x_ptr + row * x_row_stride, areas, seq_ptr, pid, H, cols, mask,
                           RANK, WORLD, PROGRAMS, BITS, COPIES)
    if ADD_NORM:
        s = acc.to(sum_ptr.dtype.element_ty).to(tl.float32)
        if PRELOAD:
            _add_rms_norm_row(s, r, w, out_ptr, sum_ptr, row, H, eps, cols, mask)
        else:
            r = tl.load(res_ptr + row * res_row_stride + cols, mask=mask,
                        other=0.0).to(tl.float32)
            _add_rms_norm_row(s, r, w_ptr, out_ptr, sum_ptr, row, H, eps, cols, mask, True)
    else:
        tl.store(sum_ptr + row * H + cols, acc.to(sum_ptr.dtype.element_ty), mask=mask)


def all_reduce_push_triton(x: torch.Tensor, areas: Sequence[torch.Tensor], seqs: torch.Tensor,
                           rank: int) -> torch.Tensor:
    """The sum over the ranks of `x` [..., H] (at most `MAX_PROGRAMS` rows), in a new tensor:
    the data-signalled push kernel without the add and the norm, over the same memory and call
    counts (`all_reduce_add_rms_norm_push_triton`'s, signal "data"), so the two interleave.
    Summed in fp32 in rank order, rounded once to x's dtype (the add-norm form's `summed`
    before its residual). Collective as that one."""
    world = len(areas)
    h = x.shape[-1]
    rows = x.reshape(-1, h).contiguous()
    t = rows.shape[0]
    if not 0 <= rank < world or t > MAX_PROGRAMS or x.element_size() not in (2, 4):
        raise ValueError(f"rank {rank} of {world}, {t} rows (at most {MAX_PROGRAMS}), "
                         f"{x.dtype} (16- or 32-bit)")
    if areas[rank].numel() < area_elements(world, h) or seqs.numel() < MAX_PROGRAMS:
        raise ValueError(f"areas of {areas[rank].numel()} and counts of {seqs.numel()} are too "
                         f"small for {world} ranks of width {h}: see area_elements")
    summed = torch.empty_like(rows)
    if t:
        block, num_warps = row_settings(h)
        _push_data_add_rms_norm_kernel[(t,)](
            rows, rows, rows, rows, summed, tuple(areas), seqs, h, rows.stride(0),
            rows.stride(0), 0.0, RANK=rank, WORLD=world, PROGRAMS=MAX_PROGRAMS,
            BITS=8 * x.element_size(), BLOCK_H=block, ADD_NORM=False,
            COPIES=copies(block, num_warps), num_warps=num_warps, **pdl_launch(x))
    return summed.view(x.shape)


def all_reduce_add_rms_norm_push_triton(x: torch.Tensor, residual: torch.Tensor,
                                        weight: torch.Tensor, eps: float,
                                        areas: Sequence[torch.Tensor],
                                        flags: Sequence[torch.Tensor], seqs: torch.Tensor,
                                        rank: int, signal: str = "data",
                                        shares: bool = False,
                                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """`all_reduce_add_rms_norm_ref`'s (normed, summed) for at most `MAX_PROGRAMS` rows of
    `x` [..., H], in new tensors. Collective: every rank calls it with the same shapes, in the
    same order. `areas` / `flags`: every rank's landing area (x's dtype, `area_elements`) and
    flags (int32, `flag_slots`), in rank order, zeros before the first call (with
    `signal="data"`, the default, the areas' bytes are `EMPTY_BYTE` instead, and the flags
    unused); `seqs`:
    this rank's call counts (int32 [MAX_PROGRAMS], zeros at first); `rank`: this one's
    index. `shares` (signal "data" only): x is a split-K linear's fp32 shares [S, T, H] of the
    rank's rows, summed in share order and rounded to residual's dtype first, as the linear
    would have summed them (`gemm.linear_shares`): the same bits, one launch and one memory
    round trip fewer."""
    world = len(areas)
    h = x.shape[-1]
    if shares:
        if signal != "data" or x.dim() != 3 or x.dtype != torch.float32:
            raise ValueError(f"shares: fp32 [S, T, H] with signal 'data', got {x.dtype} "
                             f"{tuple(x.shape)}, signal {signal!r}")
        x = x.contiguous()
        rows = x[0]
    else:
        rows = x.reshape(-1, h).contiguous()
    t = rows.shape[0]
    if len(flags) != world or not 0 <= rank < world:
        raise ValueError(f"{world} areas, {len(flags)} flag arrays, rank {rank}")
    if t > MAX_PROGRAMS:
        raise ValueError(f"{t} rows: the push kernel takes at most {MAX_PROGRAMS}")
    if (areas[rank].numel() < area_elements(world, h) or flags[rank].numel() < flag_slots(world)
            or seqs.numel() < MAX_PROGRAMS):
        raise ValueError(f"areas of {areas[rank].numel()}, flags of {flags[rank].numel()} and "
                         f"counts of {seqs.numel()} are too small for {world} ranks of width "
                         f"{h}: see area_elements and flag_slots")
    res = residual.reshape(-1, h)
    res = res if res.stride(-1) == 1 else res.contiguous()
    out_dtype = residual.dtype if shares else rows.dtype
    normed = torch.empty(rows.shape, dtype=out_dtype, device=rows.device)
    summed = torch.empty(rows.shape, dtype=out_dtype, device=rows.device)
    if t and signal == "data":
        if out_dtype.itemsize not in (2, 4):
            raise ValueError(f"signal='data' needs 16- or 32-bit rows, got {out_dtype}")
        block, num_warps = row_settings(h)
        pdl = pdl_launch(x)
        _push_data_add_rms_norm_kernel[(t,)](
            x if shares else rows, res, weight, normed, summed, tuple(areas), seqs, h,
            rows.stride(0), res.stride(0), eps, RANK=rank, WORLD=world, PROGRAMS=MAX_PROGRAMS,
            BITS=8 * out_dtype.itemsize, BLOCK_H=block, SHARES=x.shape[0] if shares else 0,
            share_stride=x.stride(0) if shares else 0, num_warps=num_warps,
            PRELOAD=PRELOAD and pdl["PDL"], COPIES=copies(block, num_warps), **pdl)
    elif t:
        block, num_warps = row_settings(h)
        _push_add_rms_norm_kernel[(t,)](
            rows, res, weight, normed, summed, tuple(areas), tuple(flags), seqs, h,
            rows.stride(0), res.stride(0), eps, RANK=rank, WORLD=world, PROGRAMS=MAX_PROGRAMS,
            BLOCK_H=block, num_warps=num_warps, **pdl_launch(x))
    shape = x.shape[1:] if shares else x.shape
    return normed.view(shape), summed.view(shape)


class PushAddNorm:
    """openinfer-core's `SymmetricPushAddNormKernel` over this module: the call, its row limit,
    the sizes of the memory it needs and the byte that memory starts as; `signal`: how a row
    says it landed (`push_signal()`)."""

    max_rows = MAX_PROGRAMS

    def __init__(self, signal: str = "data") -> None:
        if signal not in SIGNALS:
            raise ValueError(f"signal {signal!r}: use flags or data")
        self.signal = signal
        self.area_fill = EMPTY_BYTE if signal == "data" else 0
        self.takes_shares = signal == "data"

    def area_elements(self, world: int, hidden: int) -> int:
        return area_elements(world, hidden)

    def flag_slots(self, world: int) -> int:
        return flag_slots(world)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float, areas: Sequence[torch.Tensor], flags: Sequence[torch.Tensor],
                 seqs: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        return all_reduce_add_rms_norm_push_triton(x, residual, weight, eps, areas, flags,
                                                   seqs, rank, self.signal)

    def reduce_shares(self, shares: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float, areas: Sequence[torch.Tensor], flags: Sequence[torch.Tensor],
                      seqs: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The call's (normed, summed) with x given as a split-K linear's fp32 shares
        [S, T, H], where the rows are their own signal; None with flags."""
        if self.signal != "data":
            return None
        return all_reduce_add_rms_norm_push_triton(shares, residual, weight, eps, areas, flags,
                                                   seqs, rank, "data", shares=True)

    def all_reduce(self, x: torch.Tensor, areas: Sequence[torch.Tensor], seqs: torch.Tensor,
                   rank: int) -> torch.Tensor | None:
        """`all_reduce_push_triton` where the rows are their own signal; None with flags."""
        if self.signal != "data":
            return None
        return all_reduce_push_triton(x, areas, seqs, rank)
