# mypy: disable-error-code="no-untyped-def"
"""`_prefill_kernel`, long prefill chunks: varlen causal attention over the cached prefix,
program = (BLOCK_M queries, request, head), reading K/V through the block table one tile at a
time (`tiles.attend_tile`). `paged_prefill` launches it at `PrefillConfig`'s defaults.

(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from openinfer_kernels.attention.tiles import LOG2E, attend_tile
from openinfer_kernels.dot import dot_options
from openinfer_kernels.kv_store.reference import FP8_KV_DTYPE
from openinfer_kernels.kv_store.triton import fp8_scale_tensors
from openinfer_kernels.pdl import pdl_enter, pdl_launch

LONG_PROMPT = 2048  # past this many queries a request's prefill takes 128-query tiles


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
    k_scale_ptr, v_scale_ptr, scale_log2,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr,
    KV_FP8: tl.constexpr = False, HEAVY_FIRST: tl.constexpr = False,
):
    pdl_enter(PDL)
    if HEAVY_FIRST:
        # Grid (head, request, query block), the last query blocks (the most keys under the
        # causal mask) launched first, so the short ones fill in at the end.
        head = tl.program_id(0)
        seq = tl.program_id(1)
        m_block = tl.num_programs(2) - 1 - tl.program_id(2)
    else:
        m_block = tl.program_id(0)
        seq = tl.program_id(1)
        head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    num_queries = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if m_block * BLOCK_M >= num_queries:  # the grid is sized for the longest request
        return
    length = tl.load(seq_lens_ptr + seq)
    kv_head = head // GROUP

    # Query i of n sits at position length - n + i and sees keys 0..that position.
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < num_queries
    d_mask = offs_d < HEAD_DIM
    q_ptrs = (q_ptr + (q_start + offs_m)[:, None].to(tl.int64) * stride_qt + head * stride_qh
              + offs_d[None, :])
    q = tl.load(q_ptrs, mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    q_pos = length - num_queries + offs_m
    first_pos = length - num_queries + m_block * BLOCK_M
    # Keys before `full_end` are seen by every row of the tile: no causal mask there. Keys up
    # to `kv_end` are seen by some row; later tiles are hidden from all of them and skipped.
    full_end = (first_pos + 1) // BLOCK_N * BLOCK_N
    kv_end = tl.minimum(first_pos + BLOCK_M, length)

    table_ptr = block_tables_ptr + seq * stride_bt
    k_head_ptr = k_cache_ptr + kv_head * stride_kh
    v_head_ptr = v_cache_ptr + kv_head * stride_vh
    if KV_FP8:  # e4m3 pages: the KV head's k scale folds into the softmax scale
        scale_log2 = scale_log2 * tl.load(k_scale_ptr + kv_head)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = attend_tile(q, acc, m_i, l_i, start, full_end, q_pos, k_head_ptr,
                                    v_head_ptr, table_ptr, offs_d, d_mask, scale_log2,
                                    stride_kb, stride_ks, stride_vb, stride_vs,
                                    PAGE, BLOCK_N, False, PRECISION, UPCAST)
    for start in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = attend_tile(q, acc, m_i, l_i, start, kv_end, q_pos, k_head_ptr,
                                    v_head_ptr, table_ptr, offs_d, d_mask, scale_log2,
                                    stride_kb, stride_ks, stride_vb, stride_vs,
                                    PAGE, BLOCK_N, True, PRECISION, UPCAST)

    out = acc / l_i[:, None]
    if KV_FP8:  # ...and its v scale multiplies the output
        out = out * tl.load(v_scale_ptr + kv_head)
    out_ptrs = (out_ptr + (q_start + offs_m)[:, None].to(tl.int64) * stride_ot
                + head * stride_oh + offs_d[None, :])
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


@dataclass(frozen=True, slots=True)
class PrefillConfig:
    """`_prefill_kernel`'s launch settings. The defaults are `paged_prefill`'s: 128 queries
    and 3 stages a tile past LONG_PROMPT queries, else up to 64 and 2 (`block_m`, `num_stages`
    None), the heaviest query blocks first; chosen with `python -m benchmarks.ops.run --ops
    prefill_attention --sweep`, whose prompts of 2048 and 8192 tokens fall on either side of
    LONG_PROMPT. The kernel tests and `benchmarks/ops` launch others through
    `launch_prefill`."""

    block_m: int | None = None
    block_n: int = 64
    num_warps: int = 4
    num_stages: int | None = None
    heavy_first: bool = True


DEFAULT_PREFILL = PrefillConfig()


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  block_tables: torch.Tensor, seq_lens: torch.Tensor,
                  query_start_loc: torch.Tensor, scale: float,
                  max_query_len: int, *, k_scale: torch.Tensor | None = None,
                  v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """`paged_attention_ref` for any batch; `max_query_len` (the longest request's query count,
    a host int) sizes the grid. Launches at `PrefillConfig`'s defaults."""
    return launch_prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                          max_query_len, DEFAULT_PREFILL, k_scale=k_scale, v_scale=v_scale)


def launch_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   block_tables: torch.Tensor, seq_lens: torch.Tensor,
                   query_start_loc: torch.Tensor, scale: float, max_query_len: int,
                   config: PrefillConfig, *, k_scale: torch.Tensor | None = None,
                   v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """`paged_prefill` at the launch settings `config`; e4m3 caches as `launch_split`'s."""
    num_tokens, num_heads, head_dim = q.shape
    _, page, kv_heads, _ = k_cache.shape
    out = torch.empty_like(q)
    if num_tokens == 0 or max_query_len == 0:
        return out
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1 or q.stride(2) != 1:
        raise ValueError("paged_prefill needs q and the caches contiguous in the head dim")
    # Short queries (decode rows, small chunks) need not pay for 64-row tiles.
    long = max_query_len > LONG_PROMPT
    block_m = config.block_m or (
        128 if long else min(64, max(16, triton.next_power_of_2(max_query_len))))
    num_stages = config.num_stages or (3 if long else 2)
    heavy_first = config.heavy_first
    block_d = max(16, triton.next_power_of_2(head_dim))
    grid = (triton.cdiv(max_query_len, block_m), seq_lens.shape[0], num_heads)
    if heavy_first:
        grid = grid[::-1]
    k_scale_ptr, v_scale_ptr = fp8_scale_tensors(k_cache, k_scale, v_scale)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out,
        k_scale_ptr, v_scale_ptr, scale * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=num_heads // kv_heads, HEAD_DIM=head_dim, PAGE=page,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_D=block_d, **dot_options(q),
        num_warps=config.num_warps, num_stages=num_stages,
        KV_FP8=k_cache.dtype == FP8_KV_DTYPE, HEAVY_FIRST=heavy_first, **pdl_launch(q),
    )
    return out
