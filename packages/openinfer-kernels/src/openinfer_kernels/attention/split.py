# mypy: disable-error-code="no-untyped-def"
"""The split kernel for batches of short queries (decode rows, prefix-cache hits, small
chunks), and its launchers.

`_split_kernel` + `_merge_kernel`: the context is split (flash-decoding); program = (query block
of one request, kv head, split) attends BLOCK_Q queries x all query heads of one KV group,
reading K/V through the block table one tile at a time (`tiles.attend_tile`), and the merge
weighs the splits by their log-sum-exp. With `OPENINFER_SPLIT_MERGE=last` the merge is the
split kernel's own instead: each split stores its part, then counts itself in on its (query
block, kv head)'s arrival count (`split_k.py`'s semaphore), and the last to arrive merges the
parts and zeroes the count (one launch, not two). It is not the default: Qwen3-8B's batch-1
TPOT at TP2 on H200s was 2.94 ms with it and 2.77 ms with `_merge_kernel`
(`benchmarks/device/gpu_check.sh tplatency` with TP_VARIANTS=OPENINFER_SPLIT_MERGE=last runs
the pair): the waiting last program costs more than the launch it saves. The launch depends on
T, B and the head counts only: each program finds its request (binary search over
`query_start_loc`) and its share of the context on the device, so one captured CUDA graph
replays correctly for any lengths. `paged_split` launches it at `SplitConfig`'s defaults.

(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from openinfer_kernels.attention.tiles import LOG2E, attend_tile, fold_kv_tile, kv_tile_ptrs
from openinfer_kernels.device import sm_count
from openinfer_kernels.dot import dot_options
from openinfer_kernels.kv_store.reference import FP8_KV_DTYPE
from openinfer_kernels.kv_store.triton import fp8_scale_tensors
from openinfer_kernels.pdl import pdl_enter, pdl_launch, preloads
from openinfer_kernels.split_k import counts_for

MAX_SPLITS = 16
# kernel (default): `_merge_kernel` merges the splits | last: the last split to arrive; read once
LAST_MERGES = os.environ.get("OPENINFER_SPLIT_MERGE", "kernel") == "last"
PRELOAD = preloads("attention")  # read once, as the launchers' other switches


# Integer arguments that vary from step to step are not specialized on (Triton would compile a
# variant for 1, for multiples of 16 and for the rest): a step must never wait on the JIT. The
# split count is one of them (it follows the batch size): every CUDA-graph size shares a variant.
@triton.jit(do_not_specialize=["num_seqs", "num_splits", "num_tokens"])
def _split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    out_ptr, part_out_ptr, part_lse_ptr, k_scale_ptr, v_scale_ptr, count_ptr,
    scale_log2, num_seqs, num_splits, num_tokens,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, SPLIT: tl.constexpr,
    DECODE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr,
    KV_FP8: tl.constexpr = False, HEAVY_FIRST: tl.constexpr = False,
    SERIAL: tl.constexpr = False, PRELOAD: tl.constexpr = False,
):
    # PRELOAD at decode (one query a request): everything but q and this step's keys is read
    # before the wait (`pdl_enter`), the split's first tile of keys included, so that only q's
    # load and the new keys' follow it. SERIAL zeroes rows first, which must wait.
    EARLY: tl.constexpr = PRELOAD and DECODE and not SERIAL
    if not EARLY:
        pdl_enter(PDL)
    if HEAVY_FIRST:
        # Grid (kv head, query block, split), the last query blocks (the most keys under the
        # causal mask) launched first across all KV heads, so the short ones fill in at the end.
        kv_head = tl.program_id(0)
        kv_heads = tl.num_programs(0)
        pid = tl.num_programs(1) - 1 - tl.program_id(1)
    else:
        pid = tl.program_id(0)
        kv_head = tl.program_id(1)
        kv_heads = tl.num_programs(1)
    split = tl.program_id(2)
    if SERIAL:  # noqa: SIM102 (a constexpr branch: compiled out, not a runtime test)
        if (pid == 0) & (split == 0):
            # Padding past the requests' tokens (a CUDA graph's bucket): no request owns those
            # rows; zeroed here, one KV group's heads by each kv head's first program.
            _zero_rows(out_ptr, tl.load(query_start_loc_ptr + num_seqs), num_tokens, kv_head,
                       stride_ot, stride_oh, GROUP, HEAD_DIM, BLOCK_G, BLOCK_D)
    if DECODE:  # one program per request, which has at most one query
        seq = pid
        q_block = 0
    else:
        # Request b owns programs from qsl[b] // BLOCK_Q + b on: at least as many as its query
        # blocks, so a grid of T // BLOCK_Q + B covers any split of T tokens over B requests.
        # The owner of `pid` is the last b whose first program is <= pid (binary search).
        lo = pid * 0
        hi = lo + num_seqs
        while hi - lo > 1:
            mid = (lo + hi) // 2
            owns = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= pid
            lo = tl.where(owns, mid, lo)
            hi = tl.where(owns, hi, mid)
        seq = lo
        q_block = pid - (tl.load(query_start_loc_ptr + seq) // BLOCK_Q + seq)
    q_start = tl.load(query_start_loc_ptr + seq)
    num_queries = tl.load(query_start_loc_ptr + seq + 1) - q_start
    first = q_block * BLOCK_Q
    if first >= num_queries:  # past the request's queries (or it has none this step)
        return
    length = tl.load(seq_lens_ptr + seq)

    # Row r is query first + r // BLOCK_G of the request, query head kv_head * GROUP + r % BLOCK_G.
    offs_r = tl.arange(0, BLOCK_Q * BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    query = first + offs_r // BLOCK_G
    g = offs_r % BLOCK_G
    r_mask = (query < num_queries) & (g < GROUP)
    d_mask = offs_d < HEAD_DIM
    tokens = (q_start + query).to(tl.int64)
    heads = kv_head * GROUP + g
    q_ptrs = q_ptr + tokens[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    if not EARLY:  # (EARLY: after the wait, below)
        q = tl.load(q_ptrs, mask=r_mask[:, None] & d_mask[None, :], other=0.0)
    # Query i of n sits at position length - n + i and sees keys 0..that position: keys before
    # `full_end` are seen by every row, keys up to `kv_end` by some.
    q_pos = length - num_queries + query
    full_end = length - num_queries + first + 1
    kv_end = length - num_queries + tl.minimum(first + BLOCK_Q, num_queries)
    # Whole pages per split; the last splits may get fewer keys or none.
    chunk = tl.cdiv(tl.cdiv(kv_end, num_splits), PAGE) * PAGE
    start = split * chunk
    end = tl.minimum(start + chunk, kv_end)
    # Whole tiles without the causal mask, then the rest with it (tiles aligned from `start`:
    # a partial unmasked tile followed by a masked one would load one tile more).
    mid_end = start + tl.maximum(0, tl.minimum(end, full_end) - start) // BLOCK_N * BLOCK_N

    table_ptr = block_tables_ptr + seq * stride_bt
    k_head_ptr = k_cache_ptr + kv_head * stride_kh
    v_head_ptr = v_cache_ptr + kv_head * stride_vh
    if KV_FP8:  # e4m3 pages: the KV head's k scale folds into the softmax scale
        scale_log2 = scale_log2 * tl.load(k_scale_ptr + kv_head)
    m_i = tl.full([BLOCK_Q * BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_Q * BLOCK_G, BLOCK_D], tl.float32)
    if EARLY:
        # The first tile: keys before `old_end` were written by earlier steps (the kernel just
        # before this one appends this step's); the block table is the step's input.
        old_end = length - num_queries
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        k_ptrs, v_ptrs = kv_tile_ptrs(k_head_ptr, v_head_ptr, table_ptr, offs_n, n_mask,
                                      offs_d, stride_kb, stride_ks, stride_vb, stride_vs, PAGE)
        # Upcast to q's dtype (exact for an e4m3 cache) so the two loads can be joined.
        dtype = q_ptr.dtype.element_ty
        old = n_mask & (offs_n < old_end)
        k = tl.load(k_ptrs, mask=d_mask[:, None] & old[None, :], other=0.0).to(dtype)
        v = tl.load(v_ptrs, mask=old[:, None] & d_mask[None, :], other=0.0).to(dtype)
        pdl_enter(PDL)
        new = n_mask & (offs_n >= old_end)
        k_new = tl.load(k_ptrs, mask=d_mask[:, None] & new[None, :], other=0.0)
        v_new = tl.load(v_ptrs, mask=new[:, None] & d_mask[None, :], other=0.0)
        k = tl.where(new[None, :], k_new.to(dtype), k)
        v = tl.where(new[:, None], v_new.to(dtype), v)
        q = tl.load(q_ptrs, mask=r_mask[:, None] & d_mask[None, :], other=0.0)
        # One query a request: every key before `end` is visible, no causal mask.
        acc, m_i, l_i = fold_kv_tile(q, k, v, acc, m_i, l_i, offs_n, n_mask, q_pos,
                                     scale_log2, False, PRECISION, UPCAST)
        first_tile = start + BLOCK_N
    else:
        first_tile = start
    for tile in range(first_tile, mid_end, BLOCK_N):
        acc, m_i, l_i = attend_tile(q, acc, m_i, l_i, tile, mid_end, q_pos, k_head_ptr,
                                    v_head_ptr, table_ptr, offs_d, d_mask, scale_log2,
                                    stride_kb, stride_ks, stride_vb, stride_vs,
                                    PAGE, BLOCK_N, False, PRECISION, UPCAST)
    for tile in range(tl.maximum(mid_end, first_tile), end, BLOCK_N):
        acc, m_i, l_i = attend_tile(q, acc, m_i, l_i, tile, end, q_pos, k_head_ptr,
                                    v_head_ptr, table_ptr, offs_d, d_mask, scale_log2,
                                    stride_kb, stride_ks, stride_vb, stride_vs,
                                    PAGE, BLOCK_N, True, PRECISION, UPCAST)

    # A row that saw no key here (an empty split, or one past its position) leaves (0, -inf):
    # it adds nothing when merged.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    if KV_FP8:  # ...and its v scale multiplies the output
        out = out * tl.load(v_scale_ptr + kv_head)
    mask = r_mask[:, None] & d_mask[None, :]
    if not SPLIT:
        out_ptrs = out_ptr + tokens[:, None] * stride_ot + heads[:, None] * stride_oh \
            + offs_d[None, :]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        # Scratch is [T, Hq, num_splits, BLOCK_D] and [T, Hq, num_splits], contiguous.
        part = (tokens * GROUP * kv_heads + heads) * num_splits + split
        tl.store(part_out_ptr + part[:, None] * BLOCK_D + offs_d[None, :], out, mask=mask)
        tl.store(part_lse_ptr + part, m_i + tl.log2(l_safe), mask=r_mask)
        if SERIAL:
            # Every split of this (query block, kv head) counts in after its part is stored;
            # the last merges them all (its peers' parts read from L2, `.cg`, never from a
            # stale line of this SM's L1) and puts the count back to 0 for the next launch.
            count = count_ptr + pid * kv_heads + kv_head
            tl.debug_barrier()
            arrived = tl.atomic_add(count, 1, sem="acq_rel", scope="gpu")
            if arrived == num_splits - 1:
                out_ptrs = out_ptr + tokens[:, None] * stride_ot + heads[:, None] * stride_oh \
                    + offs_d[None, :]
                merged = _merge_parts(part_out_ptr, part_lse_ptr, part - split, offs_d, mask,
                                      r_mask, num_splits, BLOCK_Q * BLOCK_G, BLOCK_D)
                tl.store(out_ptrs, merged.to(out_ptr.dtype.element_ty), mask=mask)
                tl.atomic_xchg(count, 0, sem="relaxed", scope="gpu")


@triton.jit
def _merge_parts(part_out_ptr, part_lse_ptr, first_part, offs_d, mask, r_mask, num_splits,
                 ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """The rows' splits (parts first_part + 0..num_splits-1 of each row) weighed by their
    log-sum-exp, as `_merge_kernel` weighs them: splits that saw no key weigh 0, and a row
    whose splits all saw none comes out 0, not NaN."""
    lse_max = tl.full([ROWS], float("-inf"), tl.float32)
    for s in range(num_splits):
        lse = tl.load(part_lse_ptr + first_part + s, mask=r_mask, other=float("-inf"),
                      cache_modifier=".cg")
        lse_max = tl.maximum(lse_max, lse)
    lse_max = tl.maximum(lse_max, -1e30)
    total = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for s in range(num_splits):
        lse = tl.load(part_lse_ptr + first_part + s, mask=r_mask, other=float("-inf"),
                      cache_modifier=".cg")
        weight = tl.exp2(lse - lse_max)
        parts = tl.load(part_out_ptr + (first_part + s)[:, None] * BLOCK_D + offs_d[None, :],
                        mask=mask, other=0.0, cache_modifier=".cg")
        total += weight
        acc += weight[:, None] * parts
    return acc / tl.where(total == 0.0, 1.0, total)[:, None]


@triton.jit
def _zero_rows(out_ptr, first_token, num_tokens, kv_head, stride_ot, stride_oh,
               GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
               BLOCK_D: tl.constexpr):
    """Zeroes query heads kv_head * GROUP .. + GROUP of tokens first_token .. num_tokens."""
    g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (g < GROUP)[:, None] & (offs_d < HEAD_DIM)[None, :]
    zeros = tl.zeros([BLOCK_G, BLOCK_D], tl.float32).to(out_ptr.dtype.element_ty)
    heads = kv_head * GROUP + g
    for token in range(first_token, num_tokens):
        tl.store(out_ptr + token * stride_ot + heads[:, None] * stride_oh
                 + offs_d[None, :], zeros, mask=mask)


@triton.jit(do_not_specialize=["num_seqs", "num_splits"])
def _merge_kernel(
    query_start_loc_ptr, part_out_ptr, part_lse_ptr, out_ptr, num_seqs, num_splits, stride_ot,
    stride_oh, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    out_ptrs = out_ptr + token.to(tl.int64) * stride_ot + head * stride_oh + offs_d
    tokens = tl.load(query_start_loc_ptr + num_seqs)  # a step input: read before the wait
    pdl_enter(PDL)
    if token >= tokens:
        # Padding past the requests' tokens (a CUDA graph's bucket): no split wrote it.
        tl.store(out_ptrs, tl.zeros([BLOCK_D], tl.float32).to(out_ptr.dtype.element_ty),
                 mask=d_mask)
        return
    s_mask = offs_s < num_splits
    part = (token.to(tl.int64) * tl.num_programs(1) + head) * num_splits + offs_s
    lse = tl.load(part_lse_ptr + part, mask=s_mask, other=float("-inf"))
    # All splits empty (a zero-length context): weights 0 everywhere, output 0, not NaN.
    lse_max = tl.maximum(tl.max(lse, 0), -1e30)
    weight = tl.exp2(lse - lse_max)
    parts = tl.load(part_out_ptr + part[:, None] * BLOCK_D + offs_d[None, :],
                    mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    total = tl.sum(weight, 0)
    out = tl.sum(weight[:, None] * parts, 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def num_splits_for(programs: int, kv_heads: int, device: torch.device) -> int:
    """Enough (query block, kv head, split) programs to fill every SM about twice, given
    `programs` query blocks. Never from the context lengths: those change between replays of a
    captured graph. (Under the interpreter: 4 SMs, which keeps a few splits in play.)"""
    wanted = triton.cdiv(2 * sm_count(device), max(1, programs * kv_heads))
    return max(1, min(MAX_SPLITS, wanted))


def split_tiles(max_query_len: int, group: int) -> tuple[int, int]:
    """(BLOCK_Q, BLOCK_G): queries and query heads per program, all heads of one KV group. One
    query: the group padded to 16 rows (the tensor cores' least). More: 64 rows whatever the
    query count, so one compiled variant serves every step (a step never waits on the JIT for
    a new tile size; short queries are memory bound, the idle rows cost no traffic). 128 rows
    would be faster for a prompt alone (0.127 against 0.143 ms a layer at 2048 tokens), but a
    CUDA graph's step holds decodes beside its prompt chunk, and there 128 rows cost 17-24 %
    more (`benchmarks/ops`' `mixed_step_attention`)."""
    if max_query_len <= 1:
        return 1, max(16, triton.next_power_of_2(group))
    block_g = triton.next_power_of_2(group)
    return max(1, 64 // block_g), block_g


@dataclass(frozen=True, slots=True)
class SplitConfig:
    """`_split_kernel`'s launch settings. The defaults are `paged_split`'s: the split count from
    `num_splits_for`, 64-key tiles, 4 warps, 2 stages, the query rows of `split_tiles`, and
    past decode the heaviest query blocks first across all KV heads. Launch order and stages
    were chosen with `python -m benchmarks.ops.run --ops prefill_attention --sweep` (prompts of
    2048 and 8192 tokens) and `--ops mixed_step_attention --sweep` (2 or 3 stages in each mixed
    step of a 2048-token CUDA graph bucket). The kernel tests and `benchmarks/ops` launch
    others through `launch_split`."""

    num_splits: int | None = None
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    rows: int | None = None  # query rows a program past decode
    heavy_first: bool = True


DEFAULT_SPLIT = SplitConfig()


def paged_split(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                block_tables: torch.Tensor, seq_lens: torch.Tensor,
                query_start_loc: torch.Tensor, scale: float,
                max_query_len: int, *, k_scale: torch.Tensor | None = None,
                v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """`paged_attention_ref` for any batch whose longest request has at most `max_query_len`
    queries, with the context split among programs (flash-decoding) and each program holding
    all query heads of one KV group. No host sync, scratch from `torch.empty`, launches that
    depend only on the shapes and `max_query_len`: safe to capture in a CUDA graph, which then
    replays correctly for any lengths and any spread of up to T tokens over the B requests."""
    return launch_split(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                        max_query_len, DEFAULT_SPLIT, k_scale=k_scale, v_scale=v_scale)


def launch_split(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor,
                 query_start_loc: torch.Tensor, scale: float, max_query_len: int,
                 config: SplitConfig, *, k_scale: torch.Tensor | None = None,
                 v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """`paged_split` at the launch settings `config`. The caches may be e4m3 with fp32 scales
    per KV head (`kv_store.quantize_kv`; 1.0 where None): a program's KV head's k scale
    folds into its softmax scale, its v scale into its output, both exact up to fp32
    rounding. Other caches read no scale (a constexpr switch)."""
    num_tokens, num_heads, head_dim = q.shape
    _, page, kv_heads, _ = k_cache.shape
    batch = seq_lens.shape[0]
    out = torch.empty_like(q)
    if num_tokens == 0 or batch == 0:
        return out
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1 or q.stride(2) != 1:
        raise ValueError("paged attention needs q and the caches contiguous in the head dim")
    group = num_heads // kv_heads
    decode = max_query_len <= 1
    block_q, block_g = split_tiles(max_query_len, group)
    if config.rows and not decode:
        block_q = max(1, config.rows // block_g)
    # Decode: one program per request. Otherwise T // BLOCK_Q + B covers every request's query
    # blocks; splits are sized as if the tokens were in one request (the fewest programs).
    programs = batch if decode else num_tokens // block_q + batch
    splits = config.num_splits or num_splits_for(
        batch if decode else num_tokens // block_q + 1, kv_heads, q.device)
    block_d = max(16, triton.next_power_of_2(head_dim))
    part_out = part_lse = out  # unused when there is one split
    if splits > 1:
        part_out = torch.empty(num_tokens, num_heads, splits, block_d, dtype=torch.float32,
                               device=q.device)
        part_lse = torch.empty(num_tokens, num_heads, splits, dtype=torch.float32,
                               device=q.device)
    heavy_first = config.heavy_first and not decode
    k_scale_ptr, v_scale_ptr = fp8_scale_tensors(k_cache, k_scale, v_scale)
    # The splits merged by their last program (one launch) when asked, where the counts are
    # at hand.
    counts = counts_for(q.device, programs * kv_heads) if splits > 1 and LAST_MERGES else None
    grid = (kv_heads, programs, splits) if heavy_first else (programs, kv_heads, splits)
    pdl = pdl_launch(q)
    _split_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, part_out, part_lse,
        k_scale_ptr, v_scale_ptr, out if counts is None else counts, scale * LOG2E, batch,
        splits, num_tokens,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, PAGE=page, SPLIT=splits > 1, DECODE=decode,
        BLOCK_Q=block_q, BLOCK_G=block_g, BLOCK_N=config.block_n, BLOCK_D=block_d,
        **dot_options(q), num_warps=config.num_warps, num_stages=config.num_stages,
        KV_FP8=k_cache.dtype == FP8_KV_DTYPE, HEAVY_FIRST=heavy_first,
        SERIAL=counts is not None, PRELOAD=PRELOAD and pdl["PDL"], **pdl,
    )
    if splits > 1 and counts is None:
        _merge_kernel[(num_tokens, num_heads)](
            query_start_loc, part_out, part_lse, out, batch, splits, out.stride(0),
            out.stride(1), HEAD_DIM=head_dim,
            BLOCK_S=triton.next_power_of_2(max(splits, MAX_SPLITS)),  # one variant up to 16
            BLOCK_D=block_d, num_warps=1, **pdl_launch(q),
        )
    return out


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor,
                 query_start_loc: torch.Tensor, scale: float, *,
                 k_scale: torch.Tensor | None = None,
                 v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """`paged_split` when every request has at most one query."""
    return paged_split(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, 1,
                       k_scale=k_scale, v_scale=v_scale)
