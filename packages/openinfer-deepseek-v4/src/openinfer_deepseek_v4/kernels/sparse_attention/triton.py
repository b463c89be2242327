# mypy: disable-error-code="no-untyped-def"
"""Triton sparse attention with per-head sinks over gathered rows (DeepSeek-V4's MQA: one KV
head, K = V), and its launcher.

Program = (query token, tile of BLOCK_H query heads, split). It reads each entry row of its
share once for all heads of its tile (a [BLOCK_H, D] x [D, BLOCK_N] product), keeps an online
softmax (running max and sum, fp32 accumulator, exp2 with log2(e) in the scale), and adds the
sink to the denominator at the end. Compressed entries stored in FP8 (`Fp8Entries` rows,
`kernels/quant_sim/storage.py`) are decoded to q's dtype as they are read. The entry list
(W window rows, then K picked rows) is split among programs (flash-decoding), so one decode
token still fills the GPU; `_merge_kernel` weighs the splits by their log-sum-exp and adds the
sink there. The launch depends on shapes only (no host sync): safe to capture in a CUDA graph.

(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_deepseek_v4.kernels.quant_sim.storage import Fp8Entries
from openinfer_deepseek_v4.kernels.quant_sim.storage_triton import load_fp8_rows
from openinfer_deepseek_v4.kernels.rotary.triton import rotate_rows
from openinfer_kernels.attention.tiles import LOG2E, online_softmax_step
from openinfer_kernels.device import sm_count
from openinfer_kernels.dot import dot, dot_options
from openinfer_kernels.pdl import pdl_enter, pdl_launch

MAX_SPLITS = 16


@triton.jit
def _attend_rows(q, acc, m_i, l_i, pool_ptr, slots_ptr, offs, n_mask, stride_row, offs_d,
                 d_mask, scale_log2, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                 FP8: tl.constexpr, HEAD_DIM: tl.constexpr, NOPE: tl.constexpr,
                 SCALE_OFF: tl.constexpr):
    """Fold the rows named by `slots_ptr[offs]` (masked offsets and slots < 0 skipped) into the
    running softmax of the heads of `q` (K = V: the rows are both); `FP8`: the pool holds
    `Fp8Entries` rows (NOPE, SCALE_OFF their layout), decoded here."""
    slots = tl.load(slots_ptr + offs, mask=n_mask, other=-1)
    valid = slots >= 0
    starts = pool_ptr + tl.maximum(slots, 0).to(tl.int64) * stride_row
    if FP8:
        rows = load_fp8_rows(starts, valid, offs_d, HEAD_DIM, NOPE, SCALE_OFF, q.dtype)
    else:
        rows = tl.load(starts[:, None] + offs_d[None, :],
                       mask=valid[:, None] & d_mask[None, :], other=0.0)
    scores = dot(q, tl.trans(rows), PRECISION, UPCAST) * scale_log2
    scores = tl.where(valid[None, :], scores, float("-inf"))
    # Probabilities rounded to the rows' dtype for the PV product there, as the reference does.
    return online_softmax_step(scores, rows, acc, m_i, l_i, PRECISION, UPCAST)


@triton.jit(do_not_specialize=["num_splits", "chunk"])
def _sparse_kernel(
    q_ptr, kv_ptr, entry_ptr, window_ptr, picked_ptr, sinks_ptr, out_ptr, part_out_ptr,
    part_lse_ptr, pos_ptr, table_ptr, max_positions, scale_log2, num_splits, chunk, num_heads,
    num_window, num_picked, stride_qt, stride_qh, stride_kv, stride_entry, stride_wt,
    stride_pt, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    ENTRY_FP8: tl.constexpr, NOPE: tl.constexpr, SCALE_OFF: tl.constexpr, ROPE: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(2)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = heads < num_heads
    d_mask = offs_d < HEAD_DIM
    q = tl.load(q_ptr + token * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_mask[:, None] & d_mask[None, :], other=0.0)
    # Entry i < W is window row i, the others picked row i - W; this split owns [start, end).
    start = split * chunk
    end = tl.minimum(start + chunk, num_window + num_picked)
    window_end = tl.minimum(end, num_window)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for tile in range(start, window_end, BLOCK_N):
        offs = tile + tl.arange(0, BLOCK_N)
        acc, m_i, l_i = _attend_rows(q, acc, m_i, l_i, kv_ptr, window_ptr + token * stride_wt,
                                     offs, offs < window_end, stride_kv, offs_d, d_mask,
                                     scale_log2, PRECISION, UPCAST, False, HEAD_DIM, NOPE,
                                     SCALE_OFF)
    for tile in range(tl.maximum(start, num_window), end, BLOCK_N):
        offs = tile + tl.arange(0, BLOCK_N)
        acc, m_i, l_i = _attend_rows(q, acc, m_i, l_i, entry_ptr,
                                     picked_ptr + token * stride_pt - num_window, offs,
                                     offs < end, stride_entry, offs_d, d_mask, scale_log2,
                                     PRECISION, UPCAST, ENTRY_FP8, HEAD_DIM, NOPE, SCALE_OFF)
    mask = h_mask[:, None] & d_mask[None, :]
    if SPLIT:
        # Scratch [T, H, num_splits, BLOCK_D] and [T, H, num_splits]; a split that saw nothing
        # stores (0, -inf) and weighs nothing in the merge.
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        part = (token * num_heads + heads) * num_splits + split
        tl.store(part_out_ptr + part[:, None] * BLOCK_D + offs_d[None, :],
                 acc / l_safe[:, None], mask=mask)
        tl.store(part_lse_ptr + part, m_i + tl.log2(l_safe), mask=h_mask)
    else:
        # The sink joins the denominator only: exp(sink) with a zero value.
        sink = tl.load(sinks_ptr + heads, mask=h_mask, other=0.0) * 1.4426950408889634
        top = tl.maximum(m_i, sink)
        alpha = tl.exp2(m_i - top)
        out = acc * alpha[:, None] / (l_i * alpha + tl.exp2(sink - top))[:, None]
        out = _unrotate(out, token, pos_ptr, table_ptr, max_positions,
                        out_ptr.dtype.element_ty, HEAD_DIM, ROPE, BLOCK_H, BLOCK_D)
        tl.store(out_ptr + token * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _unrotate(out, token, pos_ptr, table_ptr, max_positions, ty: tl.constexpr,
              HEAD_DIM: tl.constexpr, ROPE: tl.constexpr, BLOCK_H: tl.constexpr,
              BLOCK_D: tl.constexpr):
    """The output rows [BLOCK_H, BLOCK_D] fp32 as the caller stores them: with ROPE, rounded to
    `ty` and their last ROPE dims rotated back by the token's position (`rms_rotary`'s inverse
    rotation, which they would otherwise take in a launch of their own)."""
    if ROPE > 0:
        out = rotate_rows(out.to(ty).to(tl.float32), token, pos_ptr, table_ptr,
                          max_positions, ty, HEAD_DIM, ROPE, BLOCK_H, BLOCK_D, True)
    return out


@triton.jit(do_not_specialize=["num_splits"])
def _merge_kernel(part_out_ptr, part_lse_ptr, sinks_ptr, out_ptr, pos_ptr, table_ptr,
                  max_positions, num_splits, num_heads, stride_ot, stride_oh,
                  HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
                  ROPE: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM
    part = (token * num_heads + head) * num_splits + offs_s
    lse = tl.load(part_lse_ptr + part, mask=s_mask, other=float("-inf"))
    sink = tl.load(sinks_ptr + head) * 1.4426950408889634
    top = tl.maximum(tl.max(lse, 0), sink)
    weight = tl.exp2(lse - top)
    parts = tl.load(part_out_ptr + part[:, None] * BLOCK_D + offs_d[None, :],
                    mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(weight[:, None] * parts, 0) / (tl.sum(weight, 0) + tl.exp2(sink - top))
    out = _unrotate(tl.reshape(out, [1, BLOCK_D]), token, pos_ptr, table_ptr, max_positions,
                    out_ptr.dtype.element_ty, HEAD_DIM, ROPE, 1, BLOCK_D)
    tl.store(out_ptr + token * stride_ot + head * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=d_mask[None, :])


def plan(num_tokens: int, num_heads: int, head_dim: int, entries: int,
         device: torch.device, fp8_entries: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_H, BLOCK_N, num_splits, num_warps) from the shapes alone (never the slot
    values: a CUDA graph replays them changed). Splits fill every SM about once, each with at
    least one tile of rows (benchmarks/device/dsv4_attention_bench.py on the H100, V4-Flash's
    64 heads x 512 over 640 entries: 64-row tiles, 10 splits at batch 1 and none at 64 were the
    fastest tried). Under the interpreter: 4 SMs, a few splits to keep the merge in play.
    A prompt-size step (`prompt_tile`) takes wider head tiles. `fp8_entries`: the entry pool
    holds FP8 rows, decoded as they are read."""
    if head_dim > 128 and (tile := prompt_tile(num_tokens, num_heads, device, fp8_entries)):
        return tile[0], tile[1], 1, tile[2]
    block_h = 16 if head_dim > 128 else min(64, max(16, triton.next_power_of_2(num_heads)))
    block_n = 64
    programs = num_tokens * triton.cdiv(num_heads, block_h)
    wanted = triton.cdiv(sm_count(device), max(1, programs))
    splits = max(1, min(MAX_SPLITS, wanted, triton.cdiv(entries, block_n)))
    return block_h, block_n, splits, 8 if head_dim > 128 else 4


def prompt_tile(num_tokens: int, num_heads: int, device: torch.device,
                fp8_entries: bool) -> tuple[int, int, int] | None:
    """(BLOCK_H, BLOCK_N, num_warps) for wide (512-dim) rows on a step of enough tokens that
    64-head programs fill every SM twice over, else None. A program then holds 32 or 64 heads,
    so each tile of entries is read (and, FP8, decoded) once for all of them. Measured with
    benchmarks/device/dsv4_attention_prefill.py on one H200 (8,192 tokens, contexts of 8K and
    64K), against the 16-head tile (16, 64, 8): at 64 heads (64, 32, 8) took bf16 CSA 4.08 /
    4.15 ms against 5.51 / 5.39, HCA 1.59 / 4.00 against 2.06 / 5.35, FP8 rows CSA 11.8 / 12.2
    against 41.6 / 44.1; at 32 heads, bf16 (32, 64, 8) CSA 2.61 / 2.63 against 2.75 / 2.82,
    and FP8 (64, 32, 8) (half its heads masked) CSA 11.7 / 12.2 against 20.9 / 22.2. Fewer
    heads (a TP4 rank's 16) were not measured: None."""
    if num_heads < 32 or num_tokens * triton.cdiv(num_heads, 64) < 2 * sm_count(device):
        return None
    if fp8_entries or num_heads >= 64:
        return 64, 32, 8
    return 32, 64, 8


def sparse_sink_attention_triton(q: torch.Tensor, kv_pool: torch.Tensor,
                                 entry_pool: torch.Tensor, window_slots: torch.Tensor,
                                 picked_slots: torch.Tensor, sinks: torch.Tensor, scale: float,
                                 *, entry_format: Fp8Entries | None = None,
                                 positions: torch.Tensor | None = None,
                                 rope_table: torch.Tensor | None = None,
                                 num_splits: int | None = None, block_h: int | None = None,
                                 block_n: int | None = None,
                                 num_warps: int | None = None) -> torch.Tensor:
    """`sparse_sink_attention_ref`'s contract on CUDA (or the interpreter). The pools' rows,
    q's head dim and the slot rows must be contiguous in their last dim. `entry_format`: the
    entry pool holds uint8 rows of that format. With `rope_table`, the stores rotate the output
    back at `positions` (the epilogue of whichever kernel stores it). The other keywords
    override the plan's tiles (tests, benchmarks/device/dsv4_attention_bench.py)."""
    num_tokens, num_heads, head_dim = q.shape
    rope = 0 if rope_table is None else rope_table.shape[1]
    if rope > head_dim or rope % 2 or (rope and (head_dim % 2 or positions is None)):
        raise ValueError(f"sparse_sink_attention: a rope table needs positions and at most "
                         f"head_dim (even) columns; got {rope} for head_dim {head_dim}")
    window, picked = window_slots.shape[1], picked_slots.shape[1]
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    for name, t in (("q", q), ("kv_pool", kv_pool), ("entry_pool", entry_pool),
                    ("window_slots", window_slots), ("picked_slots", picked_slots)):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"sparse_sink_attention needs {name} contiguous in its last dim")
    planned = plan(num_tokens, num_heads, head_dim, window + picked, q.device,
                   entry_format is not None)
    block_h = block_h or planned[0]
    block_n = block_n or planned[1]
    splits = num_splits or planned[2]
    num_warps = num_warps or planned[3]
    if not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be 1..{MAX_SPLITS}, not {splits}")
    chunk = triton.cdiv(triton.cdiv(max(window + picked, 1), splits), block_n) * block_n
    block_d = max(16, triton.next_power_of_2(head_dim))
    part_out = part_lse = out  # unused with one split
    if splits > 1:
        part_out = torch.empty(num_tokens, num_heads, splits, block_d, dtype=torch.float32,
                               device=q.device)
        part_lse = torch.empty(num_tokens, num_heads, splits, dtype=torch.float32,
                               device=q.device)
    sinks = sinks.float().contiguous()
    table = out if rope_table is None else rope_table
    pos = out if positions is None else positions
    max_positions = 1 if rope_table is None else rope_table.shape[0]
    _sparse_kernel[(num_tokens, triton.cdiv(num_heads, block_h), splits)](
        q, kv_pool, entry_pool, window_slots, picked_slots, sinks, out, part_out, part_lse,
        pos, table, max_positions, scale * LOG2E, splits, chunk, num_heads, window, picked,
        q.stride(0), q.stride(1), kv_pool.stride(0), entry_pool.stride(0),
        window_slots.stride(0), picked_slots.stride(0), out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, SPLIT=splits > 1, BLOCK_H=block_h, BLOCK_N=block_n,
        BLOCK_D=block_d, **dot_options(q), ENTRY_FP8=entry_format is not None,
        NOPE=0 if entry_format is None else entry_format.nope,
        SCALE_OFF=0 if entry_format is None else entry_format.scale_offset, ROPE=rope,
        num_warps=num_warps, num_stages=2,
        **pdl_launch(q))
    if splits > 1:
        _merge_kernel[(num_tokens, num_heads)](
            part_out, part_lse, sinks, out, pos, table, max_positions, splits, num_heads,
            out.stride(0), out.stride(1), HEAD_DIM=head_dim, BLOCK_S=MAX_SPLITS,
            BLOCK_D=block_d, ROPE=rope, num_warps=4,
            **pdl_launch(q))
    return out
