# mypy: disable-error-code="no-untyped-def"
"""The router's logits and its routing in one launch, for a decode step's few tokens: the
small-batch linear's split-K product of x and the router weight (openinfer-kernels'
`gemm/triton.py` tile, its shares summed by each column block's last share to arrive, in share
order: the bits `linear` stores), then, once every column block has summed (a second arrival
count, on the launch), its last block's program routes every token as `triton.py`'s kernel
does (the logits read back past L1: other programs wrote them). One launch where the linear
and the router took two. (The mypy line above: @triton.jit functions annotate only their
constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_deepseek_v4.kernels.router.triton import route_token
from openinfer_kernels import split_k
from openinfer_kernels.dot import dot_options
from openinfer_kernels.gemm.triton import Tile, partial_product
from openinfer_kernels.pdl import pdl_enter, pdl_launch
from openinfer_kernels.split_k import sum_if_last

MAX_TOKENS = 16  # the small-batch linear's rows with one tile (gemm/tiles.py: M = 1 or 16)


@triton.jit(do_not_specialize=["M"])
def _fused_router_kernel(x_ptr, w_ptr, part_ptr, logits_ptr, count_ptr, bias_ptr, table_ptr,
                         token_ptr, wts_ptr, ids_ptr, M, E, K, top_k, stride_xm, stride_wn,
                         stride_t, k_per_split, scale, M_PAD: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                         PRECISION: tl.constexpr, UPCAST: tl.constexpr, HASH: tl.constexpr,
                         BLOCK_E: tl.constexpr, BLOCK_TOP: tl.constexpr, PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, M_PAD)
    n_ok = rn < E
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    pdl_enter(PDL)
    acc = partial_product(x_ptr, w_ptr, rn, n_ok, rm, M, k_start, k_end, stride_xm,
                          stride_wn, M_PAD, BLOCK_N, BLOCK_K, PRECISION, UPCAST)
    mask = (rm < M)[:, None] & n_ok[None, :]
    tl.store(part_ptr + (split * M + rm[:, None]) * E + rn[None, :], acc, mask=mask)
    summed = sum_if_last(part_ptr, logits_ptr, count_ptr + pid_n, rm, rn, mask, M, E, E, E,
                         SPLIT_K, False, M_PAD, BLOCK_N)
    if summed:  # this column block's logits are stored: count the block in
        tl.debug_barrier()
        blocks = tl.num_programs(0)
        done = tl.atomic_add(count_ptr + blocks, 1, sem="acq_rel", scope="gpu")
        if done == blocks - 1:  # every block's logits are stored: route the tokens
            for t in range(M):
                route_token(pid_n * 0 + t, logits_ptr + t * E, bias_ptr, table_ptr, token_ptr,
                            wts_ptr, ids_ptr, E, top_k, stride_t, top_k, top_k, scale, HASH,
                            BLOCK_E, BLOCK_TOP, ".cg")
            tl.atomic_xchg(count_ptr + blocks, 0, sem="relaxed", scope="gpu")


def route_fused_triton(x: torch.Tensor, gate: torch.Tensor, tile: Tile,
                       bias: torch.Tensor | None, table: torch.Tensor | None,
                       token_ids: torch.Tensor | None, top_k: int,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`route_topk_triton(linear(x, gate), bias, top_k, scale)` (table None) or
    `route_hash_triton(linear(x, gate), table, token_ids, scale)` in one launch, at the small-
    batch linear's split-K `tile` for the router weight: x [T, H] (T <= MAX_TOKENS, rows
    contiguous), gate [E, H] -> (weights [T, k] fp32, ids [T, k] int64); None, nothing done,
    where the tile does not split K or the arrival counts are not at hand (inside a CUDA graph
    capture that would make them)."""
    (m, k), e = x.shape, gate.shape[0]
    if (m > MAX_TOKENS or tile.split_k < 2 or x.stride(1) != 1 or not gate.is_contiguous()
            or gate.shape[1] != k):
        return None
    blocks = triton.cdiv(e, tile.block_n)
    counts = split_k.counts_for(x.device, blocks + 1)
    if counts is None:
        return None
    k_top = top_k if table is None else table.shape[1]
    weights = torch.empty((m, k_top), dtype=torch.float32, device=x.device)
    ids = torch.empty((m, k_top), dtype=torch.int64, device=x.device)
    if m == 0:
        return weights, ids
    if table is not None and table.stride(1) != 1:
        table = table.contiguous()
    k_per_split = triton.cdiv(triton.cdiv(k, tile.split_k), tile.block_k) * tile.block_k
    part = torch.empty((tile.split_k, m, e), dtype=torch.float32, device=x.device)
    logits = torch.empty((m, e), dtype=x.dtype, device=x.device)
    table_arg = table if table is not None else ids  # unread where not hashed
    _fused_router_kernel[(blocks, tile.split_k)](
        x, gate, part, logits, counts, bias if bias is not None else logits, table_arg,
        token_ids if token_ids is not None else ids, weights, ids, m, e, k, k_top,
        x.stride(0), gate.stride(0), table_arg.stride(0), k_per_split, float(scale),
        M_PAD=1 if m == 1 else 16, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
        SPLIT_K=tile.split_k, **dot_options(x), HASH=table is not None,
        BLOCK_E=triton.next_power_of_2(e), BLOCK_TOP=triton.next_power_of_2(k_top),
        num_warps=tile.num_warps, num_stages=tile.num_stages, **pdl_launch(x))
    return weights, ids
