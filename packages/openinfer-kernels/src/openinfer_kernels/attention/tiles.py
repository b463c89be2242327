# mypy: disable-error-code="no-untyped-def"
"""What both paged attention kernels do per tile of keys: read it through the block table and
fold it into an online softmax (FlashAttention-2: running max and sum, fp32 accumulator, exp2
with log2(e) in the scale). `online_softmax_step` is shared with the model lines' own attention
kernels.

(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import triton
import triton.language as tl

from openinfer_kernels.dot import dot

LOG2E = 1.4426950408889634


@triton.jit
def kv_tile_ptrs(k_head_ptr, v_head_ptr, table_ptr, offs_n, n_mask, offs_d, stride_kb,
                 stride_ks, stride_vb, stride_vs, PAGE: tl.constexpr):
    """Where the keys of positions `offs_n` lie, transposed ([BLOCK_D, BLOCK_N]), and their
    values ([BLOCK_N, BLOCK_D]): position p lives in block `table[p // PAGE]` at offset
    `p % PAGE` (masked positions point at block 0)."""
    blocks = tl.load(table_ptr + offs_n // PAGE, mask=n_mask, other=0).to(tl.int64)
    offsets = offs_n % PAGE
    k_ptrs = (k_head_ptr + blocks[None, :] * stride_kb + offsets[None, :] * stride_ks
              + offs_d[:, None])
    v_ptrs = (v_head_ptr + blocks[:, None] * stride_vb + offsets[:, None] * stride_vs
              + offs_d[None, :])
    return k_ptrs, v_ptrs


@triton.jit
def _load_kv_tile(k_head_ptr, v_head_ptr, table_ptr, offs_n, n_mask, offs_d, d_mask,
                  stride_kb, stride_ks, stride_vb, stride_vs, PAGE: tl.constexpr):
    """Keys of positions `offs_n` transposed, [BLOCK_D, BLOCK_N], and their values,
    [BLOCK_N, BLOCK_D] (`kv_tile_ptrs`); masked positions (past the context) and head-dim
    padding load as 0 and are never read."""
    k_ptrs, v_ptrs = kv_tile_ptrs(k_head_ptr, v_head_ptr, table_ptr, offs_n, n_mask, offs_d,
                                  stride_kb, stride_ks, stride_vb, stride_vs, PAGE)
    k = tl.load(k_ptrs, mask=d_mask[:, None] & n_mask[None, :], other=0.0)
    v = tl.load(v_ptrs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)
    return k, v


@triton.jit
def online_softmax_step(scores, v, acc, m_i, l_i, PRECISION: tl.constexpr,
                        UPCAST: tl.constexpr):
    """Fold `scores` ([R, BLOCK_N], log2 units, -inf where hidden) and their values into the
    running (acc, max, sum). A row that has seen no key yet keeps max -inf; it is shifted by 0
    instead, so its weights are a clean exp2(-inf) = 0 rather than NaN."""
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_shift)
    p = tl.exp2(scores - m_shift[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    # bf16 probabilities for the PV product, as FlashAttention does: the tensor cores' input.
    acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, PRECISION, UPCAST)
    return acc, m_new, l_i


@triton.jit
def attend_tile(q, acc, m_i, l_i, tile, end, q_pos, k_head_ptr, v_head_ptr, table_ptr, offs_d,
                d_mask, scale_log2, stride_kb, stride_ks, stride_vb, stride_vs,
                PAGE: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Fold keys `tile .. tile + BLOCK_N` (those before `end`) into the running softmax of the
    rows of `q` (`fold_kv_tile`)."""
    offs_n = tile + tl.arange(0, BLOCK_N)
    n_mask = offs_n < end
    k, v = _load_kv_tile(k_head_ptr, v_head_ptr, table_ptr, offs_n, n_mask,
                         offs_d, d_mask, stride_kb, stride_ks, stride_vb, stride_vs, PAGE)
    return fold_kv_tile(q, k, v, acc, m_i, l_i, offs_n, n_mask, q_pos, scale_log2, CAUSAL,
                        PRECISION, UPCAST)


@triton.jit
def fold_kv_tile(q, k, v, acc, m_i, l_i, offs_n, n_mask, q_pos, scale_log2,
                 CAUSAL: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Fold a loaded tile (keys transposed [BLOCK_D, BLOCK_N] and values of positions `offs_n`,
    those outside `n_mask` zero) into the running softmax of the rows of `q`; with CAUSAL, row r
    sees only keys up to its position `q_pos[r]`. An e4m3 cache is upcast to q's dtype, exactly
    (its scales are the caller's: k_scale in `scale_log2`, v_scale on the output)."""
    k = k.to(q.dtype)
    v = v.to(q.dtype)
    scores = dot(q, k, PRECISION, UPCAST) * scale_log2
    visible = n_mask[None, :]
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= q_pos[:, None])
    scores = tl.where(visible, scores, float("-inf"))
    return online_softmax_step(scores, v, acc, m_i, l_i, PRECISION, UPCAST)
