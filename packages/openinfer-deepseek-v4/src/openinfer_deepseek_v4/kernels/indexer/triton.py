# mypy: disable-error-code="no-untyped-def"
"""Triton lightning indexer: the scores kernel, and the launchers of the public ops (the
ordered top-k kernels are in `topk_triton.py`, sorting, and `topk_select_triton.py`, a radix
select that a prompt step takes unless OPENINFER_DSV4_TOPK=sort).

`_scores_kernel`: program = (tile of BLOCK_E entries, block of TOKENS query tokens): the
tile's keys once for all index heads and all the block's tokens (a [heads, d] x [d, BLOCK_E]
product a token), ReLU, weighted sum over the heads. The paged form finds entry j's row through
the request's block table and skips the tiles its queries cannot see. Decode steps (few tokens,
each its own request) take one token a program, the token first in the grid, so one token
spreads its key stream (the bulk of the bytes: 16k entries x 128 dims at a 64k context) over
the whole GPU. A prompt's tokens
share their request's keys: TOKENS of them a program read (and, stored in FP4, decode) a key
tile once, and with the entry tiles fastest in the grid the programs running together share
one block's q in L2 instead of reading every token's q again for every tile (8192 tokens
against a long context: q is ~134 MB, more than L2). A token of another request than the
block's first reads its own keys. The scores go through HBM to the top-k (T x entries fp32:
~3% of the key bytes), so no program streams a whole key set alone. Keys stored in FP4
(`Fp4Keys` rows, `kernels/quant_sim/storage.py`) are decoded to q's dtype as they are read.
Launches depend on shapes only: graph-safe.

(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from openinfer_deepseek_v4.kernels.indexer.topk_select_triton import launch_topk_select
from openinfer_deepseek_v4.kernels.indexer.topk_triton import entry_rows, launch_topk
from openinfer_deepseek_v4.kernels.quant_sim.storage import Fp4Keys
from openinfer_deepseek_v4.kernels.quant_sim.storage_triton import load_fp4_rows
from openinfer_kernels.dot import dot, dot_options
from openinfer_kernels.pdl import pdl_enter, pdl_launch


@triton.jit
def _tile_keys(keys_ptr, table_ptr, request, entries, e_mask, offs_d, d_mask, stride_key,
               stride_bt, TY: tl.constexpr, PAGED: tl.constexpr, RATIO: tl.constexpr,
               BLOCK_SIZE: tl.constexpr, SLOTS_PER_BLOCK: tl.constexpr,
               BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, FP4: tl.constexpr):
    """Keys of entries `entries` ([BLOCK_E, BLOCK_D] in TY, 0 outside `e_mask`): paged, through
    `request`'s block table row; FP4 rows decoded."""
    if PAGED:
        rows = entry_rows(tl.where(e_mask, entries, 0), table_ptr + request * stride_bt,
                          RATIO, BLOCK_SIZE, SLOTS_PER_BLOCK)
    else:
        rows = entries.to(tl.int64)
    if FP4:  # BLOCK_D == HEAD_DIM: a power of two
        keys = load_fp4_rows(keys_ptr + rows * stride_key, e_mask, BLOCK_D, BLOCK_E, TY)
    else:
        keys = tl.load(keys_ptr + rows[:, None] * stride_key + offs_d[None, :],
                       mask=e_mask[:, None] & d_mask[None, :], other=0.0)
    return keys


@triton.jit
def _visible(positions_ptr, tokens, t_ok, num_entries, PAGED: tl.constexpr,
             RATIO: tl.constexpr):
    """How many entries each of `tokens` sees: (position + 1) // RATIO paged (at most
    num_entries), every entry flat; none past the step's tokens."""
    seen = tl.where(t_ok, num_entries, 0)
    if PAGED:
        positions = tl.load(positions_ptr + tokens, mask=t_ok, other=-1)
        seen = tl.where(t_ok, tl.minimum((positions + 1) // RATIO, num_entries), 0)
    return seen.to(tl.int32)


@triton.jit
def _scores_kernel(
    q_ptr, w_ptr, keys_ptr, table_ptr, requests_ptr, positions_ptr, scores_ptr,
    scale, num_heads, num_entries, num_tokens,
    stride_qt, stride_qh, stride_wt, stride_key, stride_bt, stride_st,
    HEAD_DIM: tl.constexpr, PAGED: tl.constexpr, RATIO: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, SLOTS_PER_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, TOKENS: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, FP4: tl.constexpr,
    ENTRIES_FIRST: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    # One token a program (decode): the grid is (token, tile), as a decode step always ran;
    # blocks of tokens: (tile, block), the tiles fastest.
    tile = tl.program_id(1 if TOKENS == 1 else 0) * BLOCK_E
    first = tl.program_id(0 if TOKENS == 1 else 1).to(tl.int64) * TOKENS
    block = first + tl.arange(0, TOKENS)
    seen = _visible(positions_ptr, block, block < num_tokens, num_entries, PAGED, RATIO)
    if tile >= tl.max(seen, 0):  # no token of the block sees this tile
        return
    entries = tile + tl.arange(0, BLOCK_E)
    heads = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = heads < num_heads
    d_mask = offs_d < HEAD_DIM
    request0 = 0
    if PAGED:
        request0 = tl.load(requests_ptr + first).to(tl.int64)
    # The block's keys, up to what its furthest-seeing token sees, through its first
    # token's request.
    block_keys = _tile_keys(keys_ptr, table_ptr, request0, entries, entries < tl.max(seen, 0),
                            offs_d, d_mask, stride_key, stride_bt, q_ptr.dtype.element_ty, PAGED,
                            RATIO, BLOCK_SIZE, SLOTS_PER_BLOCK, BLOCK_E, BLOCK_D, FP4)
    for i in range(TOKENS):
        token = first + i
        end = tl.max(tl.where(block == token, seen, 0), 0)
        if tile < end:
            e_mask = entries < end
            keys = block_keys
            if PAGED:
                request = tl.load(requests_ptr + token).to(tl.int64)
                if request != request0:
                    keys = _tile_keys(keys_ptr, table_ptr, request, entries, e_mask, offs_d,
                                      d_mask, stride_key, stride_bt, q_ptr.dtype.element_ty,
                                      PAGED, RATIO, BLOCK_SIZE, SLOTS_PER_BLOCK, BLOCK_E,
                                      BLOCK_D, FP4)
            q = tl.load(q_ptr + token * stride_qt + heads[:, None] * stride_qh
                        + offs_d[None, :], mask=h_mask[:, None] & d_mask[None, :], other=0.0)
            w = tl.load(w_ptr + token * stride_wt + heads, mask=h_mask, other=0.0)
            w = w.to(tl.float32) * scale
            if ENTRIES_FIRST:
                # [BLOCK_E, BLOCK_H]: the sum over the heads runs along a row, within a warp,
                # where [BLOCK_H, BLOCK_E]'s runs down the columns, across the warps.
                dots = tl.maximum(dot(keys, tl.trans(q), PRECISION, UPCAST), 0.0)
                scores = tl.sum(dots * w[None, :], 1)
            else:
                dots = tl.maximum(dot(q, tl.trans(keys), PRECISION, UPCAST), 0.0)
                scores = tl.sum(dots * w[:, None], 0)
            tl.store(scores_ptr + token * stride_st + entries, scores, mask=e_mask)


# Query tokens a scores program takes: one at decode sizes (each token its own request, and
# one token's keys spread over the GPU), PROMPT_TOKENS past DECODE_TOKENS tokens a step.
DECODE_TOKENS = 256
# A prompt step's scores programs: PROMPT_TOKENS tokens each, the product as keys x q^T (the
# sum over the heads within a warp). dsv4_indexer_bench.py on one H200, 8,192 tokens, against
# 8 tokens heads first: 16 entries first took bf16 keys 0.70 / 9.15 / 76.6 ms at 8K / 64K /
# 512K of context against 0.89 / 11.4 / 93.6, FP4 keys 1.05 / 12.3 / 102 against 1.30 / 16.5
# / 134. (The sum over the heads runs in another order, so near-tied picks may differ from the
# heads-first kernel's; the golden gates hold with either.)
PROMPT_TOKENS = 16
PROMPT_ENTRIES_FIRST = True
MAX_GRID_Y = 65535
# The ordered top-k of a prompt step (past DECODE_TOKENS tokens): `select` (topk_select_triton
# .py, a radix select a row) or `sort` (topk_triton.py, a row cut into pieces, every chunk
# sorted); the same picks. The same bench, 8,192 tokens: select 0.56 / 3.86 / 29.1 ms at 8K /
# 64K / 512K of context against sort's 0.61 / 6.25 / 50.5. Decode steps always sort (one
# token against 512K: sort 0.17 ms, select 0.89).
TOPK_ENV = "OPENINFER_DSV4_TOPK"
_TOPK = os.environ.get(TOPK_ENV) or "select"
if _TOPK not in ("sort", "select"):
    raise ValueError(f"{TOPK_ENV} must be 'select' or 'sort' (or unset: select), not "
                     f"{_TOPK!r}")


def _launch_scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor,
                   scores: torch.Tensor, scale: float, paged: dict[str, object],
                   key_format: Fp4Keys | None = None, tokens: int | None = None,
                   block_e: int | None = None, warps: int = 4,
                   entries_first: bool | None = None) -> None:
    """Fill scores [T, E] (E = scores.shape[1]); `paged` holds the paged arguments, or is
    empty for flat keys (every entry, no causal limit); `key_format`: keys are uint8 rows of
    that format; `tokens`: query tokens a program (a power of two; default from T, as
    DECODE_TOKENS says); `block_e` (entries a tile, a power of two; default by the heads'
    width), `warps` and `entries_first` (the product as keys x q^T, entries its rows; default
    PROMPT_ENTRIES_FIRST past DECODE_TOKENS tokens): the launch's other knobs (benchmarks,
    tests)."""
    num_tokens, num_heads, head_dim = q.shape
    if q.stride(2) != 1 or keys.stride(-1) != 1 or weights.stride(-1) != 1:
        raise ValueError("the indexer needs q, keys and weights contiguous in their last dim")
    block_h = max(16, triton.next_power_of_2(num_heads))
    block_e = block_e or (64 if block_h * head_dim > 4096 else 128)
    # Blocks of tokens are the grid's second axis, which CUDA caps at 65,535 programs.
    tokens = tokens or (1 if num_tokens <= DECODE_TOKENS else max(
        PROMPT_TOKENS, triton.next_power_of_2(triton.cdiv(num_tokens, MAX_GRID_Y))))
    if entries_first is None:
        entries_first = PROMPT_ENTRIES_FIRST and num_tokens > DECODE_TOKENS
    table = paged.get("block_tables", scores)
    assert isinstance(table, torch.Tensor)
    grid = (triton.cdiv(scores.shape[1], block_e), triton.cdiv(num_tokens, tokens))
    _scores_kernel[grid[::-1] if tokens == 1 else grid](
        q, weights, keys, table, paged.get("requests", scores),
        paged.get("positions", scores), scores, scale, num_heads, scores.shape[1], num_tokens,
        q.stride(0), q.stride(1), weights.stride(0), keys.stride(-2), table.stride(0),
        scores.stride(0), HEAD_DIM=head_dim, PAGED=bool(paged),
        RATIO=paged.get("ratio", 1), BLOCK_SIZE=paged.get("block_size", 1),
        SLOTS_PER_BLOCK=paged.get("slots_per_block", 1), BLOCK_H=block_h, BLOCK_E=block_e,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), TOKENS=tokens, **dot_options(q),
        FP4=key_format is not None, ENTRIES_FIRST=entries_first, num_warps=warps,
        **pdl_launch(q))


def indexer_scores_triton(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, *,
                          softmax_scale: float, weights_scale: float,
                          tokens: int | None = None) -> torch.Tensor:
    """`indexer_scores_ref`'s contract: q [T, H, d], keys [E, d], weights [T, H] -> [T, E]
    fp32. `tokens`: query tokens a program (benchmarks, tests; default by T)."""
    scores = torch.empty(q.shape[0], keys.shape[0], dtype=torch.float32, device=q.device)
    if scores.numel():
        _launch_scores(q, weights, keys, scores, softmax_scale * weights_scale, {},
                       tokens=tokens)
    return scores


def indexer_topk_triton(scores: torch.Tensor, positions: torch.Tensor, *, ratio: int,
                        top_k: int) -> torch.Tensor:
    """`indexer_topk_ordered_ref`'s contract: scores [T, E], positions [T] -> picks
    [T, min(top_k, E)] int64, best first, ties to the earlier entry, -1 padding."""
    out = torch.empty(scores.shape[0], min(top_k, scores.shape[1]), dtype=torch.int64,
                      device=scores.device)
    if out.numel():
        _launch_topk(scores.float().contiguous(), positions, out, ratio, {})
    return out


def _launch_topk(scores: torch.Tensor, positions: torch.Tensor, out: torch.Tensor, ratio: int,
                 paged: dict[str, object]) -> None:
    """The ordered top-k of each row, by TOPK_ENV's method on a prompt step (the same picks
    either way), else by sorting."""
    if _TOPK == "select" and scores.shape[0] > DECODE_TOKENS:
        launch_topk_select(scores, positions, out, ratio, paged)
    else:
        launch_topk(scores, positions, out, ratio, paged)


def indexer_topk_paged_triton(q: torch.Tensor, weights: torch.Tensor, index_pool: torch.Tensor,
                              block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                              positions: torch.Tensor, *, ratio: int, block_size: int,
                              top_k: int, softmax_scale: float, weights_scale: float,
                              as_slots: bool = False, max_entries: int | None = None,
                              requests: torch.Tensor | None = None,
                              key_format: Fp4Keys | None = None,
                              tokens: int | None = None) -> torch.Tensor:
    """`indexer_topk_paged_ref`'s contract. Scratch: [T, max_entries] fp32 scores, where
    `max_entries` (default: what the block table can hold, max_blocks * block_size // ratio)
    bounds every query's visible entries; pass a smaller one (the step's max_seq_len // ratio)
    to save memory and launch fewer programs. `tokens`: the scores kernel's query tokens a
    program (benchmarks, tests; default by T)."""
    from openinfer_deepseek_v4.kernels.slots.triton import token_requests_triton

    num_tokens = q.shape[0]
    capacity = block_tables.shape[1] * block_size // ratio
    num_entries = capacity if max_entries is None else min(max_entries, capacity)
    if num_tokens == 0 or num_entries == 0 or top_k == 0:
        return torch.full((num_tokens, top_k), -1, dtype=torch.int32, device=q.device)
    # every pick is stored (-1 past a query's entries): KP >= top_k
    out = torch.empty((num_tokens, top_k), dtype=torch.int32, device=q.device)
    if requests is None:
        requests = token_requests_triton(query_start_loc, num_tokens)
    paged: dict[str, object] = {
        "block_tables": block_tables, "requests": requests,
        "positions": positions, "ratio": ratio, "block_size": block_size,
        "slots_per_block": index_pool.shape[1], "as_slots": as_slots}
    scores = torch.empty(num_tokens, num_entries, dtype=torch.float32, device=q.device)
    _launch_scores(q, weights, index_pool.flatten(0, 1), scores,
                   softmax_scale * weights_scale, paged, key_format, tokens)
    _launch_topk(scores, positions, out, ratio, paged)
    return out
