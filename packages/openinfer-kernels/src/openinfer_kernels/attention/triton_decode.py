# mypy: disable-error-code="no-untyped-def"
"""Decode attention that norms, rotates and appends for itself (`paged_decode_norm_rope`):
Qwen3's per-head q/k RMSNorm and rotary, the K/V append and split-context attention of a
decode step in one kernel, where `qk_norm_rope_append` and `paged_decode` take two.

Program = (request, KV head, split), as `_split_kernel`'s decode programs. Before its PDL wait
a program reads what older kernels and the host wrote: the norm weights, its position's rotary
row, the step's lengths and block table, and its first tile of earlier steps' keys and values.
After the wait it norms and rotates its q heads as the projection just wrote them (each split
its own copy), and attends. The split whose share of the context holds the new key (position
`seq_lens - 1`) norms and rotates that key, writes it and its value into the caches for later
steps, and folds it into its softmax from registers. Partial results merge in `_merge_kernel`.

(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from openinfer_kernels.attention.triton import (
    LOG2E,
    MAX_SPLITS,
    _attend_tile,
    _dot,
    _dot_options,
    _load_kv_tile,
    _merge_kernel,
    _online_softmax_step,
    num_splits_for,
)
from openinfer_kernels.pdl import pdl_enter, pdl_launch


class NormRope(NamedTuple):
    """What the decode kernel needs besides attention's own arguments: `qk_norm_rope_append`'s."""

    k: torch.Tensor  # [T, Hk, D], as the projection wrote it (strided views allowed)
    v: torch.Tensor  # [T, Hk, D]
    q_weight: torch.Tensor  # [D]
    k_weight: torch.Tensor  # [D]
    eps: float
    positions: torch.Tensor  # [T] int64
    cos_sin: torch.Tensor  # [max_pos, D]: cos halves, then sin halves
    slot_mapping: torch.Tensor  # [T] int64, negative: not appended


@triton.jit
def _rope_params(w_ptr, cos_ptr, offs_d, d_mask, HEAD_DIM: tl.constexpr, DTYPE: tl.constexpr):
    """The norm weight at each dim and at its rotary partner (d + D/2 mod D), and cos / sin at
    each dim, rounded to the output dtype first as the reference's table is."""
    half: tl.constexpr = HEAD_DIM // 2
    partner = (offs_d + half) % HEAD_DIM
    w = tl.load(w_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    w_partner = tl.load(w_ptr + partner, mask=d_mask, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + offs_d % half, mask=d_mask, other=0.0).to(DTYPE).to(tl.float32)
    sin = tl.load(cos_ptr + half + offs_d % half, mask=d_mask, other=0.0)
    return w, w_partner, cos, sin.to(DTYPE).to(tl.float32)


@triton.jit
def _norm_rope_rows(row_ptrs, offs_d, mask, w, w_partner, cos, sin, eps,
                    HEAD_DIM: tl.constexpr, DTYPE: tl.constexpr):
    """Heads ([R, 1] pointers to dim 0 of each, `mask` [R, BLOCK_D]) RMS-normed and rotated
    (NeoX halves), rounded where `qk_norm_rope` rounds: x1' = n1 cos - n2 sin,
    x2' = n2 cos + n1 sin. Each row is read twice, the second time with its halves swapped."""
    half: tl.constexpr = HEAD_DIM // 2
    partner = (offs_d + half) % HEAD_DIM
    x = tl.load(row_ptrs + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    x_partner = tl.load(row_ptrs + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]
    n = ((x * inv_rms).to(DTYPE).to(tl.float32) * w[None, :]).to(DTYPE).to(tl.float32)
    n_partner = ((x_partner * inv_rms).to(DTYPE).to(tl.float32)
                 * w_partner[None, :]).to(DTYPE).to(tl.float32)
    sign = tl.where(offs_d < half, -1.0, 1.0)[None, :]
    return (n * cos[None, :] + sign * n_partner * sin[None, :]).to(DTYPE)


@triton.jit(do_not_specialize=["num_splits"])
def _decode_norm_rope_kernel(
    q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, pos_ptr, slot_ptr, cos_sin_ptr,
    k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    out_ptr, part_out_ptr, part_lse_ptr, scale_log2, eps, num_splits,
    stride_qt, stride_qh, stride_knt, stride_knh, stride_vnt, stride_vnh, stride_cs,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    DTYPE: tl.constexpr = k_cache_ptr.dtype.element_ty
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    # Before the wait: step inputs, weights, and keys of earlier steps (see the module doc).
    token = tl.load(query_start_loc_ptr + seq)
    working = tl.load(query_start_loc_ptr + seq + 1) > token  # else no query this step
    token = token.to(tl.int64)
    length = tl.load(seq_lens_ptr + seq)
    cos_ptr = cos_sin_ptr + tl.load(pos_ptr + token) * stride_cs
    qw, qw_partner, cos, sin = _rope_params(qw_ptr, cos_ptr, offs_d, d_mask, HEAD_DIM, DTYPE)
    kw, kw_partner, _, _ = _rope_params(kw_ptr, cos_ptr, offs_d, d_mask, HEAD_DIM, DTYPE)
    # Whole pages per split; the last splits may get fewer keys or none. Keys before `cached`
    # are in the cache already; the new one, at length - 1, is this step's.
    chunk = tl.cdiv(tl.cdiv(length, num_splits), PAGE) * PAGE
    start = split * chunk
    end = tl.minimum(start + chunk, length)
    cached = tl.minimum(end, length - 1)
    table_ptr = block_tables_ptr + seq * stride_bt
    k_head_ptr = k_cache_ptr + kv_head * stride_kh
    v_head_ptr = v_cache_ptr + kv_head * stride_vh
    offs_n = start + tl.arange(0, BLOCK_N)
    first_mask = offs_n < tl.where(working, cached, start)
    k_first, v_first = _load_kv_tile(k_head_ptr, v_head_ptr, table_ptr, offs_n, first_mask,
                                     offs_d, d_mask, stride_kb, stride_ks, stride_vb, stride_vs,
                                     PAGE)
    # Every program waits, even one with nothing to do: were all to end before their wait,
    # this kernel could finish before the one before it, and the next would not wait for that.
    pdl_enter(PDL)
    if not working:
        return

    # Row g is query head kv_head * GROUP + g of the request's one token.
    g = tl.arange(0, BLOCK_G)
    r_mask = g < GROUP
    heads = kv_head * GROUP + g
    q = _norm_rope_rows(q_ptr + token * stride_qt + heads[:, None] * stride_qh, offs_d,
                        r_mask[:, None] & d_mask[None, :], qw, qw_partner, cos, sin, eps,
                        HEAD_DIM, DTYPE)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    scores = _dot(q, k_first, PRECISION, UPCAST) * scale_log2
    scores = tl.where(first_mask[None, :], scores, float("-inf"))
    acc, m_i, l_i = _online_softmax_step(scores, v_first, acc, m_i, l_i, PRECISION, UPCAST)
    for tile in range(start + BLOCK_N, cached, BLOCK_N):
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, tile, cached, g, k_head_ptr,  # g: unused
                                     v_head_ptr, table_ptr, offs_d, d_mask, scale_log2,
                                     stride_kb, stride_ks, stride_vb, stride_vs,
                                     PAGE, BLOCK_N, False, PRECISION, UPCAST)
    if (start < length) & (length <= end):  # this split holds the new key
        slot = tl.load(slot_ptr + token)  # int64: slot * stride indexes the whole cache
        row = offs_d[None, :] < tl.where(slot >= 0, HEAD_DIM, 0)
        k_new = _norm_rope_rows(k_ptr + token * stride_knt + kv_head * stride_knh
                                + tl.zeros([1, 1], tl.int64), offs_d, d_mask[None, :], kw,
                                kw_partner, cos, sin, eps, HEAD_DIM, DTYPE)
        v_new = tl.load(v_ptr + token * stride_vnt + kv_head * stride_vnh + offs_d[None, :],
                        mask=d_mask[None, :], other=0.0).to(DTYPE)
        tl.store(k_head_ptr + slot * stride_ks + offs_d[None, :], k_new, mask=row)
        tl.store(v_head_ptr + slot * stride_vs + offs_d[None, :], v_new, mask=row)
        # One more key, from registers: the online softmax step for a tile of one.
        s = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), axis=1) * scale_log2
        m_new = tl.maximum(m_i, s)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        l_i = l_i * alpha + p
        acc = acc * alpha[:, None] + p.to(DTYPE).to(tl.float32)[:, None] * v_new.to(tl.float32)
        m_i = m_new

    # A split that saw no key (an empty one) leaves (0, -inf): it adds nothing when merged.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    mask = r_mask[:, None] & d_mask[None, :]
    if not SPLIT:
        out_ptrs = out_ptr + token * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        # Scratch is [T, Hq, num_splits, BLOCK_D] and [T, Hq, num_splits], as _split_kernel's.
        part = (token * GROUP * tl.num_programs(1) + heads) * num_splits + split
        tl.store(part_out_ptr + part[:, None] * BLOCK_D + offs_d[None, :], out, mask=mask)
        tl.store(part_lse_ptr + part, m_i + tl.log2(l_safe), mask=r_mask)


def paged_decode_norm_rope(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           query_start_loc: torch.Tensor, scale: float, norm_rope: NormRope,
                           num_splits: int | None = None, *, block_n: int = 64,
                           num_warps: int = 4, num_stages: int = 2) -> torch.Tensor:
    """`qk_norm_rope_append` then `paged_decode`, in the decode kernel itself (one launch a
    layer fewer): q ([T, Hq, D]), k and v as the projection wrote them (strided views allowed);
    every request has at most one query. Returns the attention output; mutates the caches,
    which must be contiguous. CUDA-graph safe as `paged_split` is."""
    t, hq, d = q.shape
    nr = norm_rope
    _, page, hk, _ = k_cache.shape
    batch = seq_lens.shape[0]
    if d % 2 or nr.k.shape != (t, hk, d) or nr.v.shape != nr.k.shape \
            or nr.cos_sin.shape[-1] != d or k_cache.shape[-1] != d:
        raise ValueError(f"paged_decode_norm_rope: need q [T, Hq, D], k and v [T, Hk, D] as "
                         f"the caches, cos_sin [*, D] with D even; got {tuple(q.shape)}, "
                         f"{tuple(nr.k.shape)}, {tuple(nr.v.shape)}, {tuple(k_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or k_cache.shape != v_cache.shape:
        raise ValueError("paged_decode_norm_rope: the caches must be contiguous "
                         "[num_blocks, block_size, Hk, D]")
    if q.stride(2) != 1 or nr.k.stride(2) != 1 or nr.v.stride(2) != 1 \
            or nr.cos_sin.stride(1) != 1:
        raise ValueError("paged_decode_norm_rope: q, k, v and cos_sin must be contiguous in "
                         "the head dim")
    out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    if t == 0 or batch == 0:
        return out
    group = hq // hk
    splits = num_splits or num_splits_for(batch, hk, q.device)
    block_d = max(16, triton.next_power_of_2(d))
    part_out = part_lse = out  # unused when there is one split
    if splits > 1:
        part_out = torch.empty(t, hq, splits, block_d, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(t, hq, splits, dtype=torch.float32, device=q.device)
    _decode_norm_rope_kernel[(batch, hk, splits)](
        q, nr.k, nr.v, nr.q_weight, nr.k_weight, nr.positions, nr.slot_mapping, nr.cos_sin,
        k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, part_out, part_lse,
        scale * LOG2E, nr.eps, splits,
        q.stride(0), q.stride(1), nr.k.stride(0), nr.k.stride(1), nr.v.stride(0),
        nr.v.stride(1), nr.cos_sin.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=d, PAGE=page, SPLIT=splits > 1,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
        **_dot_options(q), num_warps=num_warps, num_stages=num_stages, **pdl_launch(q),
    )
    if splits > 1:
        _merge_kernel[(t, hq)](
            query_start_loc, part_out, part_lse, out, batch, splits, out.stride(0),
            out.stride(1), HEAD_DIM=d, BLOCK_S=triton.next_power_of_2(max(splits, MAX_SPLITS)),
            BLOCK_D=block_d, num_warps=1, **pdl_launch(q),
        )
    return out
