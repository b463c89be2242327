# mypy: disable-error-code="no-untyped-def"
"""The compressor's pooling on the paged cache, in one launch: the entries whose windows close
in a step, from the per-token projections already in the cache, straight into their rows of the
entry pool.

Program (b, i) makes request b's i-th new entry, j = first_b // ratio + i, if its window closes
in this step ((j + 1) ratio - 1 <= last_b; otherwise it loops zero times and stores nothing).
It reads the window's projection rows through the projections' block table (the previous
window's too with `overlap`), softmaxes the gates (+ the position bias) per channel over the
slots in two passes (an online max and sum, then the weights), adds the weighted values,
RMS-normalises, rotates the trailing rope pairs at the window's first position, and stores
the entry through the entries' block table (another pool's: the projections live in a window
KV group, the entries in the full one). It rounds to the projections' dtype where
`compress_chunk_ref` does: the weights, each weighted value, the pooled sum, the normed entry,
cos and sin, the rotated pairs. With a row format (`kernels/quant_sim/storage.py`) it stores the
entry as its rounding's codes instead (`store_fp8_entry`, `store_fp4_key`). The grid depends only on
the batch size and a host bound on the entries per request, (B, ceil(max_query_len / ratio)): one
for decode, so a CUDA graph replays it whatever the positions. (The mypy line above: @triton.jit
functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_deepseek_v4.kernels.quant_sim.reference import hadamard_matrix
from openinfer_deepseek_v4.kernels.quant_sim.storage import Fp8Entries, RowFormat
from openinfer_deepseek_v4.kernels.quant_sim.storage_triton import store_fp4_key, store_fp8_entry
from openinfer_kernels.pdl import pdl_enter, pdl_launch

STORE_PLAIN, STORE_FP8, STORE_FP4 = 0, 1, 2


@triton.jit
def _window_gates(proj_ptr, bias_ptr, table_ptr, p0, s0, n_real, rd, d_ok, block_size,
                  RATIO: tl.constexpr, OVERLAP: tl.constexpr, D: tl.constexpr,
                  BLOCK_S: tl.constexpr):
    """Slots s0..s0+BLOCK_S of the entry whose slot 0 is at position p0: (gates [BLOCK_S,
    BLOCK_D] fp32, -inf where no slot, value pointers, their mask)."""
    C: tl.constexpr = 2 if OVERLAP else 1
    rs = s0 + tl.arange(0, BLOCK_S)
    pos = p0 + rs
    ok = (rs < n_real) & (pos >= 0)
    pos = tl.where(ok, pos, 0)
    block = tl.load(table_ptr + pos // block_size, mask=ok, other=0).to(tl.int64)
    row = proj_ptr + (block * block_size + pos % block_size) * (2 * C * D)
    if OVERLAP:  # slots [0, RATIO): first halves (window j - 1); the rest: second halves
        col = (rs // RATIO)[:, None] * D + rd[None, :]
    else:
        col = tl.zeros([BLOCK_S, 1], dtype=tl.int32) + rd[None, :]
    mask = ok[:, None] & d_ok[None, :]
    gate = tl.load(row[:, None] + C * D + col, mask=mask, other=0.0).to(tl.float32)
    gate += tl.load(bias_ptr + (pos % RATIO)[:, None] * (C * D) + col, mask=mask, other=0.0)
    return tl.where(mask, gate, float("-inf")), row[:, None] + col, mask


@triton.jit
def _rotate(y, pos, freqs_ptr, D: tl.constexpr, ROPE: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rotate the last ROPE dims of y ([BLOCK_D] fp32, rounded to the entry dtype) as pairs
    (y[2i], y[2i+1]) by pos * freqs, cos and sin rounded to y's dtype first."""
    ty = y.dtype
    pair = tl.arange(0, BLOCK_D // 2)
    f_idx = pair - (D - ROPE) // 2
    rot = (f_idx >= 0) & (pair < D // 2)
    freq = tl.load(freqs_ptr + tl.where(rot, f_idx, 0), mask=rot, other=0.0)
    angle = pos.to(tl.float32) * freq  # 0 outside the rope dims: cos 1, sin 0, y unchanged
    cos = tl.cos(angle).to(ty).to(tl.float32)
    sin = tl.sin(angle).to(ty).to(tl.float32)
    even, odd = tl.split(tl.reshape(y.to(tl.float32), [BLOCK_D // 2, 2]))
    out = tl.join(even * cos - odd * sin, odd * cos + even * sin)
    return tl.reshape(out, [BLOCK_D]).to(ty)


@triton.jit
def _pool_kernel(proj_ptr, entries_ptr, bias_ptr, norm_w_ptr, freqs_ptr, tables_ptr,
                 entry_tables_ptr, seq_lens_ptr, qsl_ptr, h_ptr, stride_table,
                 stride_entry_table, block_size, entries_per_block, norm_eps,
                 RATIO: tl.constexpr, OVERLAP: tl.constexpr, D: tl.constexpr,
                 ROPE: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
                 STORE: tl.constexpr, ROW: tl.constexpr, NOPE: tl.constexpr,
                 ROPE_BYTES: tl.constexpr, SCALE_OFF: tl.constexpr, PDL: tl.constexpr,
                 kv_ptr, gate_ptr, slots_ptr, stride_kv, stride_gate,
                 STORE_ROWS: tl.constexpr = False, BLOCK_ROW: tl.constexpr = 1):
    pdl_enter(PDL)
    b = tl.program_id(0)
    if STORE_ROWS:
        # A decode step (one program per request, STORE_ROWS only there): the request's token's
        # kv | gate row into its projection row first (`_store_kernel`'s work), which the
        # pooling below may read; no other program reads this request's rows.
        _store_row(kv_ptr, gate_ptr, proj_ptr, slots_ptr, qsl_ptr, b, stride_kv, stride_gate,
                   (2 if OVERLAP else 1) * D, BLOCK_ROW)
        tl.debug_barrier()  # the row stored before any thread of the program reads it
    seq_len = tl.load(seq_lens_ptr + b)
    first = seq_len - (tl.load(qsl_ptr + b + 1) - tl.load(qsl_ptr + b))
    j = first // RATIO + tl.program_id(1)
    made = j < seq_len // RATIO  # its window closes at (j + 1) RATIO - 1 <= seq_len - 1
    SLOTS: tl.constexpr = (2 if OVERLAP else 1) * RATIO
    n_real = tl.where(made, SLOTS, 0)
    p0 = (j - 1) * RATIO if OVERLAP else j * RATIO
    table = tables_ptr + b.to(tl.int64) * stride_table
    rd = tl.arange(0, BLOCK_D)
    d_ok = rd < D
    m = tl.full([BLOCK_D], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, n_real, BLOCK_S):  # the softmax's max and sum, online
        gate, _, _ = _window_gates(proj_ptr, bias_ptr, table, p0, s0, n_real, rd, d_ok,
                                   block_size, RATIO, OVERLAP, D, BLOCK_S)
        m_new = tl.maximum(m, tl.max(gate, axis=0))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        total = total * tl.exp(m - shift) + tl.sum(tl.exp(gate - shift[None, :]), axis=0)
        m = m_new
    # channels past D never see a gate: shift them by 0 and divide by 1 (weights 0, not NaN)
    m = tl.where(m == float("-inf"), 0.0, m)
    total = tl.where(total == 0.0, 1.0, total)
    ty = proj_ptr.dtype.element_ty
    pooled = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, n_real, BLOCK_S):
        gate, value_ptr, mask = _window_gates(proj_ptr, bias_ptr, table, p0, s0, n_real, rd,
                                              d_ok, block_size, RATIO, OVERLAP, D, BLOCK_S)
        weight = (tl.exp(gate - m[None, :]) / total[None, :]).to(ty).to(tl.float32)
        value = tl.load(value_ptr, mask=mask, other=0.0).to(tl.float32)
        pooled += tl.sum((value * weight).to(ty).to(tl.float32), axis=0)
    pooled = pooled.to(ty).to(tl.float32)
    w = tl.load(norm_w_ptr + rd, mask=d_ok, other=0.0).to(tl.float32)
    y = (w * (pooled * tl.rsqrt(tl.sum(pooled * pooled, axis=0) / D + norm_eps))).to(ty)
    y = _rotate(y, j * RATIO, freqs_ptr, D, ROPE, BLOCK_D)
    last = (j + 1) * RATIO - 1
    entry_table = entry_tables_ptr + b.to(tl.int64) * stride_entry_table
    block = tl.load(entry_table + last // block_size, mask=made, other=0).to(tl.int64)
    dst = block * entries_per_block + (last % block_size) // RATIO
    if STORE == 1:
        store_fp8_entry(entries_ptr + dst * ROW, y, made, D, NOPE, ROPE_BYTES, SCALE_OFF,
                        BLOCK_D)
    elif STORE == 2:
        store_fp4_key(entries_ptr + dst * ROW, y, h_ptr, made, D)
    else:
        tl.store(entries_ptr + dst * ROW + rd, y.to(entries_ptr.dtype.element_ty),
                 mask=rd < tl.where(made, D, 0))


@triton.jit
def _store_row(kv_ptr, gate_ptr, proj_ptr, slots_ptr, qsl_ptr, b, stride_kv, stride_gate,
               width, BLOCK_ROW: tl.constexpr):
    """Request b's one token (none where it has no token or a negative slot): its kv columns,
    then its gate columns, into its projection row (2 width values)."""
    token = tl.load(qsl_ptr + b).to(tl.int64)
    has = tl.load(qsl_ptr + b + 1) > token
    slot = tl.load(slots_ptr + token, mask=has, other=-1).to(tl.int64)
    cols = tl.arange(0, BLOCK_ROW)
    ok = (cols < 2 * width) & (tl.zeros([BLOCK_ROW], tl.int64) + slot >= 0)
    value = _kv_gate_columns(kv_ptr, gate_ptr, token, cols, ok, width, stride_kv, stride_gate)
    tl.store(proj_ptr + tl.maximum(slot, 0) * (2 * width) + cols,
             value.to(proj_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _kv_gate_columns(kv_ptr, gate_ptr, token, cols, ok, width, stride_kv, stride_gate):
    """A token's kv | gate row at columns `cols` where `ok`: kv's `width` columns, then
    gate's."""
    in_kv = cols < width
    return tl.where(in_kv,
                    tl.load(kv_ptr + token * stride_kv + cols, mask=ok & in_kv, other=0.0),
                    tl.load(gate_ptr + token * stride_gate + cols - width,
                            mask=ok & (cols >= width), other=0.0))


def store_and_pool_triton(kv: torch.Tensor, gate: torch.Tensor, slots: torch.Tensor,
                          projections: torch.Tensor, entries: torch.Tensor,
                          position_bias: torch.Tensor, norm_weight: torch.Tensor,
                          freqs: torch.Tensor, projection_tables: torch.Tensor,
                          entry_tables: torch.Tensor, seq_lens: torch.Tensor,
                          query_start_loc: torch.Tensor, max_query_len: int, *, ratio: int,
                          overlap: bool, norm_eps: float,
                          store: RowFormat | None = None) -> None:
    """`store_and_pool_ref`: at a decode step (max_query_len 1) in one launch, the pooling
    kernel's program of each request storing its token's row before it pools; otherwise
    `store_projections_triton`, then `compress_pool_triton`."""
    if max_query_len != 1:
        store_projections_triton(kv, gate, projections.flatten(0, 1), slots)
        compress_pool_triton(projections, entries, position_bias, norm_weight, freqs,
                             projection_tables, entry_tables, seq_lens, query_start_loc,
                             max_query_len, ratio=ratio, overlap=overlap, norm_eps=norm_eps,
                             store=store)
        return
    _check_rows(kv, gate, projections.flatten(0, 1), slots)
    compress_pool_triton(projections, entries, position_bias, norm_weight, freqs,
                         projection_tables, entry_tables, seq_lens, query_start_loc,
                         max_query_len, ratio=ratio, overlap=overlap, norm_eps=norm_eps,
                         store=store, rows=(kv, gate, slots))


def compress_pool_triton(projections: torch.Tensor, entries: torch.Tensor,
                         position_bias: torch.Tensor, norm_weight: torch.Tensor,
                         freqs: torch.Tensor, projection_tables: torch.Tensor,
                         entry_tables: torch.Tensor, seq_lens: torch.Tensor,
                         query_start_loc: torch.Tensor, max_query_len: int, *, ratio: int,
                         overlap: bool, norm_eps: float, store: RowFormat | None = None,
                         rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
                         ) -> None:
    """`compress_pool_ref` in one launch (see the module docstring); mutates `entries` only
    (and, with `rows` = (kv, gate, slots) of a decode step, `store_and_pool_triton`'s, the
    projections' rows of the step's tokens, each stored by its request's program first).
    projections [blocks, block_size, 2 c d] (bf16 or fp32), entries [entry blocks,
    entries_per_block, d], both contiguous; projection_tables and entry_tables [B, max_blocks]
    (the projections' and the entries' block tables, each its pool's), seq_lens [B] and
    query_start_loc [B + 1] on the device; max_query_len a host int >= every request's new
    tokens. With `store`, entries is [entry blocks, entries_per_block, store.row_bytes]
    uint8."""
    c = 2 if overlap else 1
    d = entries.shape[-1] if store is None else store.dim
    if store is not None and (entries.dtype != torch.uint8
                              or entries.shape[-1] != store.row_bytes):
        raise ValueError(f"compress_pool: a {store} pool is [blocks, entries_per_block, "
                         f"{store.row_bytes}] uint8, got {tuple(entries.shape)} {entries.dtype}")
    if (projections.dim() != 3 or projections.shape[2] != 2 * c * d or entries.dim() != 3
            or position_bias.shape != (ratio, c * d) or norm_weight.shape != (d,)
            or 2 * freqs.shape[0] > d or d % 2):
        raise ValueError(
            f"compress_pool: need projections [blocks, block_size, 2 c d], entries [blocks, "
            f"entries_per_block, d] (d even), position_bias [ratio, c d], norm_weight [d], "
            f"freqs [<= d / 2] with c = {c}; got {tuple(projections.shape)}, "
            f"{tuple(entries.shape)}, {tuple(position_bias.shape)}, {tuple(norm_weight.shape)}, "
            f"{tuple(freqs.shape)}")
    if not (projections.is_contiguous() and entries.is_contiguous()):
        raise ValueError("compress_pool: the projection and entry pools must be contiguous")
    batch = seq_lens.shape[0]
    if batch == 0 or max_query_len <= 0:
        return
    block_d = triton.next_power_of_2(d)
    block_s = max(1, min(triton.next_power_of_2(c * ratio), 4096 // block_d))
    fp8 = store if isinstance(store, Fp8Entries) else None
    kind = STORE_PLAIN if store is None else STORE_FP8 if fp8 else STORE_FP4
    h = hadamard_matrix(d, projections.device) if kind == STORE_FP4 else norm_weight
    kv, gate, slots = rows if rows is not None else (projections, projections, seq_lens)
    _pool_kernel[(batch, triton.cdiv(max_query_len, ratio))](
        projections, entries, position_bias.float().contiguous(), norm_weight,
        freqs.float().contiguous(), projection_tables, entry_tables, seq_lens, query_start_loc,
        h, projection_tables.stride(0), entry_tables.stride(0), projections.shape[1],
        entries.shape[1], norm_eps, RATIO=ratio,
        OVERLAP=overlap, D=d, ROPE=2 * freqs.shape[0], BLOCK_S=block_s, BLOCK_D=block_d,
        STORE=kind, ROW=entries.shape[-1], NOPE=0 if fp8 is None else fp8.nope,
        ROPE_BYTES=1 if fp8 is None else fp8.rope_bytes,
        SCALE_OFF=0 if store is None else store.scale_offset, num_warps=4,
        **pdl_launch(projections), kv_ptr=kv, gate_ptr=gate, slots_ptr=slots,
        stride_kv=kv.stride(0), stride_gate=gate.stride(0), STORE_ROWS=rows is not None,
        BLOCK_ROW=triton.next_power_of_2(2 * c * d) if rows is not None else 1)


@triton.jit
def _store_kernel(kv_ptr, gate_ptr, pool_ptr, slots_ptr, width, stride_kv, stride_gate,
                  stride_pool, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Program (token, tile of BLOCK of the row's 2 width columns): kv's columns, then gate's,
    into the token's pool row (none for a negative slot)."""
    pdl_enter(PDL)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    ok = (cols < 2 * width) & (tl.zeros([BLOCK], tl.int64) + slot >= 0)
    value = _kv_gate_columns(kv_ptr, gate_ptr, token, cols, ok, width, stride_kv, stride_gate)
    tl.store(pool_ptr + tl.maximum(slot, 0) * stride_pool + cols,
             value.to(pool_ptr.dtype.element_ty), mask=ok)


def store_projections_triton(kv: torch.Tensor, gate: torch.Tensor, pool: torch.Tensor,
                             slots: torch.Tensor) -> None:
    """`store_projections_ref` in one launch (the concatenation and the scatter of the torch
    form): kv and gate [T, w] (rows may be strided, columns contiguous), pool [S, 2 w] with
    contiguous rows. The grid depends on the shapes only: safe in CUDA graphs."""
    t, width = kv.shape
    _check_rows(kv, gate, pool, slots)
    if t == 0:
        return
    block = min(1024, triton.next_power_of_2(2 * width))
    _store_kernel[(t, triton.cdiv(2 * width, block))](
        kv, gate, pool, slots, width, kv.stride(0), gate.stride(0), pool.stride(0),
        BLOCK=block, num_warps=4, **pdl_launch(kv))


def _check_rows(kv: torch.Tensor, gate: torch.Tensor, pool: torch.Tensor,
                slots: torch.Tensor) -> None:
    t, width = kv.shape
    if (gate.shape != kv.shape or pool.dim() != 2 or pool.shape[1] != 2 * width
            or slots.shape != (t,) or kv.stride(1) != 1 or gate.stride(1) != 1
            or pool.stride(1) != 1):
        raise ValueError(f"store_projections: need kv and gate [T, w], pool [S, 2 w] and slots "
                         f"[T], columns contiguous; got {tuple(kv.shape)}, {tuple(gate.shape)}, "
                         f"{tuple(pool.shape)}, {tuple(slots.shape)}")
