# mypy: disable-error-code="no-untyped-def"
"""The exponential race on the GPU: same contract and same law as reference.py, with noise from
Philox keyed by (row seed, token id).

A row's vocabulary (151,936 ids for Qwen3) is cut into `num_splits` chunks so that batch 1 still
spreads over the whole GPU: program (rows, split) races its chunk and writes its winner (score,
id); the program that finishes a row last, counted by an atomic, picks the row's best winner and
resets the count. One launch per call (a Triton launch costs 17-55 us of host time on the lent
H100 hosts), plus `_row_max_kernel` when some row has min_p, whose floor is relative to the
whole row. A program takes `ROWS` rows at once: 1 on the GPU, where one row is work enough; the
interpreter tests take thousands, since there a program costs the same whatever its tile size.

Noise: one Philox call (counter = id // 4, key = the 64-bit seed) gives the four uniforms of ids
4c .. 4c+3, so a token's noise depends on neither BLOCK, the split nor the tiling. A uniform w
becomes E = -log(1 - w) ~ Exp(1) through a series for small w: the winners are the tokens with
small E, and forming 1 - w in fp32 would round away the bits that set them apart. Scores are
kept in log2 units, (x / T - ln E) / ln 2 plus a constant, which picks the same argmax and lets
the GPU use its fast lg2 instruction.

(The mypy line above: @triton.jit kernels annotate only their constexpr parameters.)
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from openinfer_kernels.device import sm_count

BLOCK = 2048  # ids per loop step of a program (four Philox lanes of BLOCK // 4)
PROGRAMS_PER_SM = 8  # programs in flight to read the logits at full bandwidth (H100: 4 -> 8, -6%)
LOG2E = tl.constexpr(1.4426950408889634)
# Read as triton.jit reads it, when this module is (re)loaded: interpreted kernels lack libdevice.
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _log2(x, FAST: tl.constexpr):
    # fast_log2f is lg2.approx (~2^-22 relative error, plenty for noise); the interpreter has no
    # libdevice, hence the switch.
    return libdevice.fast_log2f(x) if FAST else tl.log2(x)


@triton.jit
def _neg_log2_exponential(bits, FAST: tl.constexpr):
    """-log2(E / ln 2) for E = -ln(1 - w) ~ Exp(1), w = (bits + 1/2) / 2^32 in (0, 1)."""
    w = (bits.to(tl.float32) + 0.5) * 2.3283064365386963e-10
    w = tl.minimum(w, 0.99999994)  # bits near 2^32 round to w = 1; keep E > 0
    # -log2(1 - w): a series below 1/64 (error < w^5 / 5), the log above.
    series = w * (1.0 + w * (0.5 + w * (0.33333334 + w * 0.25))) * 1.4426950408889634
    e = tl.where(w < 0.015625, series, -_log2(1.0 - w, FAST))
    return -_log2(e, FAST)


@triton.jit
def _keep_better(best, best_id, score, ids):
    # Strict: on a tie the earlier candidate, which always has the lower id, stays.
    better = score > best
    return tl.where(better, score, best), tl.where(better, ids, best_id)


@triton.jit
def _race_lane(best, best_id, row_base, row_ok, ids, hi, bits, noisy, scale, floor,
               FAST: tl.constexpr):
    """One Philox lane of a loop step: ids [1, QUADS], everything per row [ROWS, 1]."""
    x = tl.load(row_base + ids, mask=row_ok & (ids < hi), other=float("-inf")).to(tl.float32)
    z = x * scale
    score = z + tl.where(noisy, _neg_log2_exponential(bits, FAST), 0.0)
    score = tl.where(z >= floor, score, float("-inf"))
    return _keep_better(best, best_id, score, ids)


# B (rows) changes with the batch: not specialized on, so no batch size waits on the JIT.
@triton.jit(do_not_specialize=["B"])
def _row_max_kernel(logits_ptr, row_stride, part_max_ptr, B, V, CHUNK, num_splits,
                    ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < B
    split = tl.program_id(1)
    row_base = logits_ptr + rows.to(tl.int64)[:, None] * row_stride
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, V)
    acc = tl.full([ROWS, BLOCK], float("-inf"), tl.float32)
    for start in range(lo, hi, BLOCK):
        ids = (start + tl.arange(0, BLOCK))[None, :]
        x = tl.load(row_base + ids, mask=row_ok[:, None] & (ids < hi), other=float("-inf"))
        acc = tl.maximum(acc, x.to(tl.float32))
    tl.store(part_max_ptr + rows * num_splits + split, tl.max(acc, axis=1), mask=row_ok)


@triton.jit
def _race_chunk(logits_ptr, row_stride, temperature_ptr, min_p_ptr, seeds_ptr, part_max_ptr,
                rows, row_ok, lo, hi, num_splits,
                HAS_MIN_P: tl.constexpr, SPLITS: tl.constexpr, ROWS: tl.constexpr,
                BLOCK: tl.constexpr, FAST: tl.constexpr):
    """Each row's winner over ids [lo, hi): (score [ROWS], id [ROWS])."""
    row_base = logits_ptr + rows.to(tl.int64)[:, None] * row_stride
    QUADS: tl.constexpr = BLOCK // 4
    t = tl.load(temperature_ptr + rows, mask=row_ok, other=0.0)
    best = tl.full([ROWS, QUADS], float("-inf"), tl.float32)
    best_id = tl.zeros([ROWS, QUADS], tl.int32)  # an all -inf row picks id 0, as torch.argmax
    if tl.max(t, axis=0) > 0.0:  # some row samples; greedy rows among them get no noise
        noisy = t > 0.0
        scale = LOG2E / tl.where(noisy, t, 1.0)
        seed = tl.load(seeds_ptr + rows, mask=row_ok, other=0)[:, None]
        floor = tl.full([ROWS], float("-inf"), tl.float32)
        if HAS_MIN_P:
            min_p = tl.load(min_p_ptr + rows, mask=row_ok, other=0.0)
            splits = tl.arange(0, SPLITS)[None, :]
            part = tl.load(part_max_ptr + rows[:, None] * num_splits + splits,
                           mask=row_ok[:, None] & (splits < num_splits), other=float("-inf"))
            top = tl.max(part, axis=1) * scale
            use = noisy & (min_p > 0.0)
            floor = tl.where(use, top + tl.log2(tl.maximum(min_p, 1e-30)), floor)
        row_ok2 = row_ok[:, None]
        noisy2 = noisy[:, None]
        scale2 = scale[:, None]
        floor2 = floor[:, None]
        for start in range(lo, hi, BLOCK):
            quad = (start // 4 + tl.arange(0, QUADS))[None, :]
            r0, r1, r2, r3 = tl.randint4x(seed, quad)
            # Lanes in id order (4q, 4q+1, ...), so _keep_better's ties still favour lower ids.
            best, best_id = _race_lane(best, best_id, row_base, row_ok2, 4 * quad, hi, r0,
                                       noisy2, scale2, floor2, FAST)
            best, best_id = _race_lane(best, best_id, row_base, row_ok2, 4 * quad + 1, hi, r1,
                                       noisy2, scale2, floor2, FAST)
            best, best_id = _race_lane(best, best_id, row_base, row_ok2, 4 * quad + 2, hi, r2,
                                       noisy2, scale2, floor2, FAST)
            best, best_id = _race_lane(best, best_id, row_base, row_ok2, 4 * quad + 3, hi, r3,
                                       noisy2, scale2, floor2, FAST)
    else:  # every row greedy: the plain argmax, no Philox
        for start in range(lo, hi, BLOCK):
            quad = (start // 4 + tl.arange(0, QUADS))[None, :]
            for k in tl.static_range(4):
                ids = 4 * quad + k
                x = tl.load(row_base + ids, mask=row_ok[:, None] & (ids < hi),
                            other=float("-inf"))
                best, best_id = _keep_better(best, best_id, x.to(tl.float32), ids)
    top = tl.max(best, axis=1)
    return top, tl.min(tl.where(best == top[:, None], best_id, 2**31 - 1), axis=1)


@triton.jit(do_not_specialize=["B"])
def _race_kernel(logits_ptr, row_stride, temperature_ptr, min_p_ptr, seeds_ptr, part_max_ptr,
                 part_score_ptr, part_id_ptr, arrivals_ptr, out_ptr, B, V, CHUNK, num_splits,
                 HAS_MIN_P: tl.constexpr, SPLITS: tl.constexpr, ROWS: tl.constexpr,
                 BLOCK: tl.constexpr, FAST: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < B
    split = tl.program_id(1)
    lo = split * CHUNK  # a multiple of BLOCK, so of 4
    hi = tl.minimum(lo + CHUNK, V)
    top, top_id = _race_chunk(logits_ptr, row_stride, temperature_ptr, min_p_ptr, seeds_ptr,
                              part_max_ptr, rows, row_ok, lo, hi, num_splits,
                              HAS_MIN_P, SPLITS, ROWS, BLOCK, FAST)
    if SPLITS == 1:
        tl.store(out_ptr + rows, top_id.to(tl.int64), mask=row_ok)
    else:
        tl.store(part_score_ptr + rows * num_splits + split, top, mask=row_ok)
        tl.store(part_id_ptr + rows * num_splits + split, top_id, mask=row_ok)
        # Every thread's partial is written before the count goes up (the release publishes
        # them); the row's last program acquires them all with the same atomic.
        tl.debug_barrier()
        arrived = tl.atomic_add(arrivals_ptr + rows, 1, mask=row_ok, sem="acq_rel", scope="gpu")
        last = row_ok & (arrived == num_splits - 1)
        if tl.max(last.to(tl.int32), axis=0) > 0:
            splits = tl.arange(0, SPLITS)[None, :]
            mask = last[:, None] & (splits < num_splits)
            offs = rows[:, None] * num_splits + splits
            # .cg reads from L2, where the other programs' partials are, never a stale L1 line.
            score = tl.load(part_score_ptr + offs, mask=mask, other=float("-inf"),
                            cache_modifier=".cg")
            ids = tl.load(part_id_ptr + offs, mask=mask, other=0, cache_modifier=".cg")
            best = tl.max(score, axis=1)
            # Splits hold ascending id ranges: the lowest id among equal scores, as in a split.
            pick = tl.min(tl.where(score == best[:, None], ids, 2**31 - 1), axis=1)
            tl.store(out_ptr + rows, pick.to(tl.int64), mask=last)
            tl.store(arrivals_ptr + rows, tl.zeros_like(arrived), mask=last)  # for the next call


class _Workspace:
    """Scratch memory per (device, stream), kept between calls: partial winners, and arrival
    counts that are zero between launches (the last program of a row resets its count).
    Launches on one stream run in order, so they can share it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.arrivals = torch.zeros(0, dtype=torch.int32, device=device)
        self.part = torch.empty(0, dtype=torch.float32, device=device)
        self.views: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}

    def get(self, rows: int, splits: int) -> tuple[torch.Tensor, ...]:
        """(arrivals [rows], part score, part id, part max; each [rows, splits])."""
        views = self.views.get((rows, splits))
        if views is None:
            views = self.views[(rows, splits)] = self._carve(rows, splits)
        return views

    def _carve(self, rows: int, splits: int) -> tuple[torch.Tensor, ...]:
        size = rows * splits
        if self.arrivals.numel() < rows or self.part.numel() < 3 * size:
            # Views handed out earlier keep the old buffers alive; new ones use the new.
            self.arrivals = torch.zeros(max(rows, 2 * self.arrivals.numel()), dtype=torch.int32,
                                        device=self.device)
            self.part = torch.empty(max(3 * size, 2 * self.part.numel()), dtype=torch.float32,
                                    device=self.device)
            self.views.clear()
        score = self.part[:size].view(rows, splits)
        ids = self.part[size:2 * size].view(torch.int32).view(rows, splits)
        row_max = self.part[2 * size:3 * size].view(rows, splits)
        return self.arrivals[:rows], score, ids, row_max


_workspaces: dict[tuple[torch.device, int], _Workspace] = {}


def _workspace(device: torch.device) -> _Workspace:
    # The raw stream handle, as Triton's own launcher reads it: torch.cuda.current_stream()
    # costs ~9 us of host time on the lent H100 host.
    stream = 0
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        stream = torch._C._cuda_getCurrentRawStream(index)
    ws = _workspaces.get((device, stream))
    if ws is None:
        ws = _workspaces[(device, stream)] = _Workspace(device)
    return ws


def race_sample_triton(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    min_p: torch.Tensor | None,
    seeds: torch.Tensor,
    *,
    block: int = BLOCK,
    num_splits: int | None = None,
    rows_per_program: int = 1,
) -> torch.Tensor:
    """One token id per row ([B] int64); the contract of reference.race_sample_ref.

    `block` (a power of two, >= 4), `num_splits` (chunks per row; by default enough for
    PROGRAMS_PER_SM programs per SM) and `rows_per_program` (a power of two) tune the launch
    only: no choice of them changes a single result. Calls on one stream must come from one
    thread at a time (the engine samples from its step thread): they share scratch memory."""
    rows, vocab = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    device = logits.device
    out = torch.empty(rows, dtype=torch.int64, device=device)
    if rows == 0:
        return out
    row_tiles = triton.cdiv(rows, rows_per_program)
    blocks = triton.cdiv(vocab, block)
    if num_splits is None:
        # Under the interpreter, which runs one program at a time: one SM.
        num_splits = triton.cdiv(PROGRAMS_PER_SM * sm_count(device, 1), row_tiles)
    chunk = triton.cdiv(blocks, max(1, min(num_splits, blocks))) * block
    splits = triton.cdiv(vocab, chunk)
    grid = (row_tiles, splits)
    arrivals, part_score, part_id, part_max = _workspace(device).get(rows, splits)
    if min_p is not None:
        _row_max_kernel[grid](logits, logits.stride(0), part_max, rows, vocab, chunk, splits,
                              ROWS=rows_per_program, BLOCK=block)
    _race_kernel[grid](
        logits, logits.stride(0), temperature, temperature if min_p is None else min_p, seeds,
        part_max, part_score, part_id, arrivals, out, rows, vocab, chunk, splits,
        # SPLITS bounds every split count of this vocabulary: one variant for every batch size.
        HAS_MIN_P=min_p is not None, SPLITS=triton.next_power_of_2(blocks),
        ROWS=rows_per_program, BLOCK=block, FAST=not _INTERPRETED)
    return out
