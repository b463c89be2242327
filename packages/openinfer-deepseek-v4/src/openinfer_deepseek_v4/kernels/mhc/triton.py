# mypy: disable-error-code="no-untyped-def"
"""mHC around a sublayer in three launches: `hc_pre` (before it) is a split-K mix projection
plus a per-token kernel, `hc_post` (after it) one kernel. At one token `hc_pre` is one launch:
the mix projection's last program to arrive (`openinfer_kernels.split_k`'s arrival counts) does
the token's weights itself, as the second kernel would. `comb`'s Sinkhorn-Knopp runs in
`hc_post`, before its wait on the kernel ahead of it (PDL): hc_pre hands over comb's logits,
which were written at least one kernel earlier (the sublayer's), so the iterations overlap the
sublayer's last kernel instead of lengthening hc_pre's serial tail: there they took 2.3 of a
one-token hc_pre's 10.9 us on one H200 (BENCHMARKS.md). Each of a token's hc_post programs
computes the N x N comb itself (4 at V4-Flash's width), which costs less than a launch.
`benchmarks/device/dsv4_mhc_bench.py` times hc_post with one pass beside twenty.

1. `_mix_kernel`: the [T, N D] streams times fn^T ([N D, M], M = (2 + N) N, or N for the head)
   and each row's sum of squares, over a 1/SPLIT share of N D per program, into an fp32
   workspace ([SPLIT, T, M_PAD] and [SPLIT, T]). Few tokens multiply on the CUDA cores; 16 or
   more go through `tl.dot` at fp32 accuracy ("tf32x3" on the GPU, "ieee" fp32 elsewhere).
   The weightless RMS of the streams scales the product afterwards rather than the streams
   before it (the spec's order; the reference's differs by fp32 rounding only).
2. `_weights_kernel`, one program per token: adds the SPLIT shares in a fixed order (so results
   do not depend on timing), then sigmoid pre/post, comb's logits, the collapse sum_i pre_i H_i
   over the whole row, rounded to the streams' dtype, and the layer's RMSNorm in fp32 rounded
   once (the model's `rms_norm`). The head's form stops after the collapse.
3. `_expand_kernel`: comb from its logits (the softmax and Sinkhorn-Knopp iterations on an
   N x N tile in registers), then H'_k = post_k out + sum_j comb[j, k] H_j with the
   reference's rounding points: the weights to the streams' dtype first, each of the two terms
   rounded, their sum rounded. (The mypy line above: @triton.jit functions annotate only
   their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_kernels import split_k
from openinfer_kernels.pdl import pdl_enter, pdl_launch

# Tokens up to which the mix projection's last program computes the weights (one after
# another) instead of a second launch: a decode step of one request, where a launch costs
# more than the token's weights do.
SERIAL_TOKENS = 1
# The mix projection's K shares hold at least this many BLOCK_K blocks each (fewer: more
# programs, each one read less deep): MIX_MIN_K_BLOCKS for many tokens, SERIAL_MIN_K_BLOCKS
# for the one-token launch, which runs SERIAL_WARPS warps (None: enough for the weights'
# [N, D] row: 16 at V4-Flash's N 4, D 4096). There, on one H200, with comb's Sinkhorn in
# hc_post, 1 block and 16 warps took 7.2 us a call against 8.2 with 4 warps and 17.3 with 8
# blocks, the best of 1/2/4/8 x 2/4/8/16 (benchmarks/device/dsv4_mhc_bench.py, which sweeps
# them: `gpu_check.sh dsv4mhc`). Spreading the Sinkhorn tile over copies of it (its sums
# within a warp) measured no faster.
MIX_MIN_K_BLOCKS = 4
SERIAL_MIN_K_BLOCKS = 1
SERIAL_WARPS: int | None = None


@triton.jit
def _mix_kernel(x_ptr, fn_ptr, part_ptr, ssq_ptr, count_ptr, base_ptr, scale_ptr, norm_w_ptr,
                y_ptr, post_ptr, logits_ptr, T, K, K_PER, stride_xt, stride_xn, hc_eps,
                norm_eps, M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
                BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr, PRECISION: tl.constexpr,
                N: tl.constexpr, D: tl.constexpr, SPLIT_PAD: tl.constexpr,
                BLOCK_D: tl.constexpr, HEAD: tl.constexpr, SERIAL: tl.constexpr,
                PDL: tl.constexpr, NORM: tl.constexpr = True):
    # SERIAL: the tile's last program to arrive at count_ptr[pid_t] computes its tokens'
    # weights (`token_weights`, the other programs' shares read from L2) and zeroes the count.
    pdl_enter(PDL)
    pid_t, pid_s = tl.program_id(0), tl.program_id(1)
    rt = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    rm = tl.arange(0, M_PAD)
    t_ok, m_ok = rt < T, rm < M
    k_lo = pid_s * K_PER
    k_hi = tl.minimum(k_lo + K_PER, K)
    acc = tl.zeros([BLOCK_T, M_PAD], dtype=tl.float32)
    ssq = tl.zeros([BLOCK_T], dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        k_ok = rk < k_hi
        x = tl.load(x_ptr + rt[:, None].to(tl.int64) * stride_xt + rk[None, :],
                    mask=t_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        w = tl.load(fn_ptr + rm[:, None] * K + rk[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0).to(tl.float32)
        ssq += tl.sum(x * x, axis=1)
        if USE_DOT:
            acc += tl.dot(x, tl.trans(w), input_precision=PRECISION)
        else:
            acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    out = (pid_s * T + rt)[:, None] * M_PAD + rm[None, :]
    tl.store(part_ptr + out, acc, mask=t_ok[:, None])
    tl.store(ssq_ptr + pid_s * T + rt, ssq, mask=t_ok)
    if SERIAL:
        tl.debug_barrier()  # the whole share is stored before it is counted
        count = count_ptr + pid_t
        if tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == tl.num_programs(1) - 1:
            for t in range(pid_t * BLOCK_T, tl.minimum(pid_t * BLOCK_T + BLOCK_T, T)):
                token_weights(pid_t * 0 + t, x_ptr, part_ptr, ssq_ptr, base_ptr, scale_ptr,
                               norm_w_ptr,
                               y_ptr, post_ptr, logits_ptr, T, tl.num_programs(1), stride_xt,
                               stride_xn, hc_eps, norm_eps, N, D, M_PAD, SPLIT_PAD,
                               BLOCK_D, HEAD, NORM, ".cg")
            tl.atomic_xchg(count, 0, sem="relaxed", scope="gpu")


@triton.jit
def _sinkhorn(logits, hc_eps, iters):
    """[..., N, N] logits (the last two axes a matrix's rows and columns) -> rows softmaxed
    (+ hc_eps), then columns and rows normalised in turn, `iters` column passes in all."""
    e = tl.exp(logits - tl.expand_dims(tl.max(logits, axis=-1), -1))
    c = e / tl.expand_dims(tl.sum(e, axis=-1), -1) + hc_eps
    c = c / (tl.expand_dims(tl.sum(c, axis=-2), -2) + hc_eps)
    for _ in range(iters - 1):
        c = c / (tl.expand_dims(tl.sum(c, axis=-1), -1) + hc_eps)
        c = c / (tl.expand_dims(tl.sum(c, axis=-2), -2) + hc_eps)
    return c


@triton.jit
def _weights_kernel(x_ptr, part_ptr, ssq_ptr, base_ptr, scale_ptr, norm_w_ptr, y_ptr, post_ptr,
                    logits_ptr, T, SPLIT, stride_xt, stride_xn, hc_eps, norm_eps,
                    N: tl.constexpr, D: tl.constexpr, M_PAD: tl.constexpr,
                    SPLIT_PAD: tl.constexpr, BLOCK_D: tl.constexpr, HEAD: tl.constexpr,
                    PDL: tl.constexpr, NORM: tl.constexpr = True):
    pdl_enter(PDL)
    token_weights(tl.program_id(0), x_ptr, part_ptr, ssq_ptr, base_ptr, scale_ptr,
                   norm_w_ptr, y_ptr, post_ptr, logits_ptr, T, SPLIT, stride_xt, stride_xn,
                   hc_eps, norm_eps, N, D, M_PAD, SPLIT_PAD, BLOCK_D, HEAD, NORM, "")


@triton.jit
def token_weights(t, x_ptr, part_ptr, ssq_ptr, base_ptr, scale_ptr, norm_w_ptr, y_ptr,
                   post_ptr, logits_ptr, T, SPLIT, stride_xt, stride_xn, hc_eps, norm_eps,
                   N: tl.constexpr, D: tl.constexpr, M_PAD: tl.constexpr,
                   SPLIT_PAD: tl.constexpr, BLOCK_D: tl.constexpr, HEAD: tl.constexpr,
                   NORM: tl.constexpr, CACHE: tl.constexpr):
    """Token t's weights from its SPLIT shares (these and the streams read with cache modifier
    CACHE: ".cg" where other programs of the same launch wrote them), its collapse and (NORM)
    the RMSNorm of it by norm_w_ptr; comb's logits, not comb. HEAD: the head's form, `pre`
    only."""
    rs, rn, rd = tl.arange(0, SPLIT_PAD), tl.arange(0, N), tl.arange(0, BLOCK_D)
    s_ok, d_ok = rs < SPLIT, rd < D
    inv_rms = tl.rsqrt(tl.sum(tl.load(ssq_ptr + rs * T + t, mask=s_ok, other=0.0,
                                      cache_modifier=CACHE), axis=0) / (N * D) + norm_eps)
    row = part_ptr + (rs * T + t) * M_PAD  # [SPLIT_PAD] pointers: this token's shares
    pre = tl.sum(tl.load(row[:, None] + rn[None, :], mask=s_ok[:, None], other=0.0,
                         cache_modifier=CACHE), axis=0)
    pre = tl.sigmoid(pre * inv_rms * tl.load(scale_ptr) + tl.load(base_ptr + rn)) + hc_eps
    if not HEAD:
        post = tl.sum(tl.load(row[:, None] + N + rn[None, :], mask=s_ok[:, None], other=0.0,
                              cache_modifier=CACHE), 0)
        post = 2 * tl.sigmoid(post * inv_rms * tl.load(scale_ptr + 1)
                              + tl.load(base_ptr + N + rn))
        tl.store(post_ptr + t * N + rn, post)
        nn = rn[:, None] * N + rn[None, :]
        comb = tl.sum(tl.load(row[:, None, None] + 2 * N + nn[None, :, :],
                              mask=s_ok[:, None, None], other=0.0, cache_modifier=CACHE),
                      axis=0)
        logits = comb * inv_rms * tl.load(scale_ptr + 2) + tl.load(base_ptr + 2 * N + nn)
        tl.store(logits_ptr + t * N * N + nn, logits)
    h = tl.load(x_ptr + t.to(tl.int64) * stride_xt + rn[:, None] * stride_xn + rd[None, :],
                mask=d_ok[None, :], other=0.0, cache_modifier=CACHE)
    out_ty = y_ptr.dtype.element_ty
    u = tl.sum(pre[:, None] * h.to(tl.float32), axis=0).to(out_ty).to(tl.float32)
    if NORM:
        w = tl.load(norm_w_ptr + rd, mask=d_ok, other=0.0).to(tl.float32)
        u = w * (u * tl.rsqrt(tl.sum(u * u, axis=0) / D + norm_eps))
    tl.store(y_ptr + t.to(tl.int64) * D + rd, u.to(out_ty), mask=d_ok)


@triton.jit
def comb_of(logits_ptr, t, hc_eps, iters, N: tl.constexpr):
    """Token t's comb [N, N] fp32 from its logits at logits_ptr ([T, N, N] fp32)."""
    rn = tl.arange(0, N)
    return _sinkhorn(tl.load(logits_ptr + t * N * N + rn[:, None] * N + rn[None, :]), hc_eps,
                     iters)


@triton.jit
def expand_columns(out, streams_ptr, post_ptr, comb, new_ptr, t, rd, d_ok, stride_st,
                   stride_sn, N: tl.constexpr, D: tl.constexpr):
    """Token t's new streams at columns `rd` (where `d_ok`) from the sublayer's output `out`
    there (in the streams' dtype) and its comb [N, N] (`comb_of`): the weights rounded to that
    dtype first, each of the two terms rounded, their sum rounded (the reference's rounding
    points). Stored, and returned ([N, len(rd)] in the streams' dtype)."""
    rn = tl.arange(0, N)
    ty = new_ptr.dtype.element_ty
    mixed = tl.zeros([N, rd.shape[0]], dtype=tl.float32)
    for j in tl.static_range(N):  # sum_j comb[j, k] H_j, j in order
        # comb's row j (a sum of one value and zeros: exact)
        c = tl.sum(tl.where(rn[:, None] == j, comb, 0.0), axis=0).to(ty).to(tl.float32)
        h = tl.load(streams_ptr + t * stride_st + j * stride_sn + rd, mask=d_ok, other=0.0)
        mixed += c[:, None] * h.to(tl.float32)[None, :]
    post = tl.load(post_ptr + t * N + rn).to(ty).to(tl.float32)
    spread = (post[:, None] * out.to(tl.float32)[None, :]).to(ty).to(tl.float32)
    new = (spread + mixed.to(ty).to(tl.float32)).to(ty)
    tl.store(new_ptr + t * N * D + rn[:, None] * D + rd[None, :], new, mask=d_ok[None, :])
    return new


@triton.jit
def _expand_kernel(x_ptr, out_ptr, post_ptr, logits_ptr, new_ptr, stride_xt, stride_xn,
                   stride_ot, hc_eps, iters, N: tl.constexpr, D: tl.constexpr,
                   BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    # before the wait: hc_pre wrote the logits at least one kernel ago (see the module doc)
    comb = comb_of(logits_ptr, t, hc_eps, iters, N)
    pdl_enter(PDL)
    rd = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = rd < D
    out = tl.load(out_ptr + t * stride_ot + rd, mask=d_ok, other=0.0)
    expand_columns(out, x_ptr, post_ptr, comb, new_ptr, t, rd, d_ok, stride_xt, stride_xn,
                   N, D)


def _rows(streams: torch.Tensor) -> torch.Tensor:
    """streams with each token's [N, D] contiguous (a no-op for the model's streams)."""
    return (streams if streams.stride(2) == 1 and streams.stride(1) == streams.shape[2]
            else streams.contiguous())


def _mix_tiles(t: int, k: int, min_k_blocks: int) -> tuple[int, int, bool, int]:
    """(BLOCK_T, BLOCK_K, USE_DOT, K per share) of `_mix_kernel` for T tokens of K inputs, each
    share at least `min_k_blocks` BLOCK_K blocks deep."""
    use_dot = t >= 16
    if use_dot:
        block_t, block_k = min(64, triton.next_power_of_2(t)), 64
    else:  # a [BLOCK_T, M_PAD, BLOCK_K] product in registers: keep it near 4K elements
        block_t = triton.next_power_of_2(t)
        block_k = max(16, 128 // block_t)
    tiles = triton.cdiv(t, block_t)
    # ~2 programs per SM of an H100, each with at least min_k_blocks K blocks.
    split = max(1, min(triton.cdiv(264, tiles), k // (min_k_blocks * block_k)))
    k_per = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    return block_t, block_k, use_dot, k_per


def _check(streams: torch.Tensor, fn: torch.Tensor, *, head: bool) -> None:
    n = streams.shape[1] if streams.dim() == 3 else 0
    m = n if head else (2 + n) * n
    if not n or n & (n - 1) or fn.shape != (m, n * streams.shape[2]):
        raise ValueError(f"mHC: need streams [T, N, D] with N a power of two and fn "
                         f"[{'N' if head else '(2 + N) N'}, N D]; got {tuple(streams.shape)} "
                         f"and {tuple(fn.shape)}")


def _weights(streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
             norm_weight: torch.Tensor | None, hc_eps: float, norm_eps: float,
             head: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hc_pre or (`head`) hc_head, its collapse normed where `norm_weight` is given:
    `_mix_kernel`'s shares of the mix projection, then `_weights_kernel` per token, or (up to
    SERIAL_TOKENS tokens, where the arrival counts are at hand) the mix kernel's last
    program: (y, post, comb's logits)."""
    _check(streams, fn, head=head)
    streams, fn = _rows(streams), fn.contiguous()
    t, n, d = streams.shape
    y = torch.empty((t, d), dtype=streams.dtype, device=streams.device)
    post = torch.empty((t, n), dtype=torch.float32, device=streams.device)
    logits = torch.empty((t, n, n), dtype=torch.float32, device=streams.device)
    if t == 0:
        return y, post, logits
    k, m = n * d, fn.shape[0]
    m_pad = max(16, triton.next_power_of_2(m))
    serial = t <= SERIAL_TOKENS
    block_t, block_k, use_dot, k_per = _mix_tiles(
        t, k, SERIAL_MIN_K_BLOCKS if serial else MIX_MIN_K_BLOCKS)
    tiles, split = triton.cdiv(t, block_t), triton.cdiv(k, k_per)
    part = torch.empty((split, t, m_pad), dtype=torch.float32, device=streams.device)
    ssq = torch.empty((split, t), dtype=torch.float32, device=streams.device)
    counts = split_k.counts_for(streams.device, tiles) if serial else None
    base, scale = base.float().contiguous(), scale.float().contiguous()
    norm = norm_weight if norm_weight is not None else y
    block_d = triton.next_power_of_2(d)
    warps = max(4, min(16, n * block_d // 1024))  # the weights' [N, D] row
    mix_warps = (SERIAL_WARPS or warps) if serial else 4
    _mix_kernel[(tiles, split)](
        streams, fn, part, ssq, counts if serial else ssq, base, scale, norm, y, post, logits,
        t, k, k_per, streams.stride(0), streams.stride(1), hc_eps, norm_eps, M=m,
        M_PAD=m_pad, BLOCK_T=block_t, BLOCK_K=block_k, USE_DOT=use_dot,
        PRECISION="tf32x3" if streams.is_cuda else "ieee", N=n, D=d,
        SPLIT_PAD=triton.next_power_of_2(split), BLOCK_D=block_d, HEAD=head,
        NORM=norm_weight is not None, SERIAL=serial, num_warps=mix_warps,
        **pdl_launch(streams))
    if not serial:
        _weights_kernel[(t,)](
            streams, part, ssq, base, scale, norm, y, post, logits, t, split, streams.stride(0),
            streams.stride(1), hc_eps, norm_eps, N=n, D=d, M_PAD=m_pad,
            SPLIT_PAD=triton.next_power_of_2(split), BLOCK_D=block_d,
            HEAD=head, NORM=norm_weight is not None, num_warps=warps, **pdl_launch(streams))
    return y, post, logits


def hc_pre_triton(streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor,
                  scale: torch.Tensor, norm_weight: torch.Tensor, *, hc_eps: float,
                  norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`hc_pre_ref` in two launches (one at a single token): streams [T, N, D] (bf16 or
    fp32), fn [(2 + N) N, N D], base [(2 + N) N], scale [3], norm_weight [D] -> (x [T, D] in
    the streams' dtype, post [T, N] fp32, comb's logits [T, N, N] fp32, for hc_post). No host
    synchronisation: safe in CUDA graphs."""
    return _weights(streams, fn, base, scale, norm_weight, hc_eps, norm_eps)


def hc_head_triton(streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor,
                   scale: torch.Tensor, *, hc_eps: float, norm_eps: float,
                   norm_weight: torch.Tensor | None = None) -> torch.Tensor:
    """`hc_head_ref` in two launches (one at a single token): streams [T, N, D], fn [N, N D],
    base [N], scale [1] (norm_weight [D]: the last norm too) -> [T, D] in the streams'
    dtype."""
    return _weights(streams, fn, base, scale, norm_weight, hc_eps, norm_eps, head=True)[0]


def hc_post_triton(streams: torch.Tensor, out: torch.Tensor, post: torch.Tensor,
                   comb_logits: torch.Tensor, *, hc_eps: float,
                   sinkhorn_iters: int) -> torch.Tensor:
    """`hc_post_ref` in one launch: streams [T, N, D], the sublayer's out [T, D] (the streams'
    dtype, rows may be strided), post [T, N] and comb's logits [T, N, N] fp32 (hc_pre's) ->
    new streams [T, N, D] (contiguous, the streams' dtype)."""
    t, n, d = streams.shape
    if (out.shape != (t, d) or post.shape != (t, n) or comb_logits.shape != (t, n, n)
            or n & (n - 1)):
        raise ValueError(f"hc_post: need streams [T, N, D] (N a power of two), out [T, D], post "
                         f"[T, N], comb's logits [T, N, N]; got {tuple(streams.shape)}, "
                         f"{tuple(out.shape)}, {tuple(post.shape)}, {tuple(comb_logits.shape)}")
    streams = _rows(streams)
    out = out if out.stride(-1) == 1 else out.contiguous()
    post, comb_logits = post.float().contiguous(), comb_logits.float().contiguous()
    new = torch.empty((t, n, d), dtype=streams.dtype, device=streams.device)
    if t == 0:
        return new
    block_d = min(1024, triton.next_power_of_2(d))
    _expand_kernel[(t, triton.cdiv(d, block_d))](
        streams, out, post, comb_logits, new, streams.stride(0), streams.stride(1), out.stride(0),
        hc_eps, sinkhorn_iters, N=n, D=d, BLOCK_D=block_d, num_warps=4, **pdl_launch(streams))
    return new
