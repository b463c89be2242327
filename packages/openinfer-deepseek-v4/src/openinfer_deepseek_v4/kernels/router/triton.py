# mypy: disable-error-code="no-untyped-def"
"""The router after its logits in one launch, one program per token: the E scores in
registers, then either the top-k of score + bias by k rounds of max (a tie goes to the earlier
expert: the lowest index holding the maximum) or the token's row of the hash table; then the
picked scores over their sum, times the scale. Shapes come from the arguments alone and
nothing is read back to the host, so a decode step that routes this way can be captured in a
CUDA graph.

softplus as torch computes it (x above 20 is x itself, else log1p(exp(x))), log1p by Kahan's
u = 1 + y; log(u) * y / (u - 1), accurate where 1 + y rounds. The weights agree with the
reference's up to a few fp32 ulps (exp, log and the sum's order); the picks agree wherever
the biased scores are not within those ulps of each other.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_kernels.pdl import pdl_enter, pdl_launch


@triton.jit
def _scores(logits_row, re, ok, CACHE: tl.constexpr):
    """sqrt(softplus(logits)) [BLOCK_E] fp32; 0 past E."""
    g = tl.load(logits_row + re, mask=ok, other=0.0, cache_modifier=CACHE).to(tl.float32)
    y = tl.exp(tl.minimum(g, 20.0))
    u = 1.0 + y
    log1p = tl.where(u == 1.0, y, tl.log(u) * y / (u - 1.0))
    return tl.where(ok, tl.sqrt(tl.where(g > 20.0, g, log1p)), 0.0)


@triton.jit
def route_token(t, logits_row, bias_ptr, table_ptr, token_ptr, w_ptr, ids_ptr, E, top_k,
                stride_t, stride_w, stride_i, scale, HASH: tl.constexpr, BLOCK_E: tl.constexpr,
                BLOCK_K: tl.constexpr, CACHE: tl.constexpr):
    """Token t's experts and weights from its logits row (read with cache modifier CACHE:
    ".cg" where other programs of the same launch wrote it)."""
    re = tl.arange(0, BLOCK_E)
    ok = re < E
    rk = tl.arange(0, BLOCK_K)
    k_ok = rk < top_k
    s = _scores(logits_row, re, ok, CACHE)
    if HASH:
        token = tl.load(token_ptr + t).to(tl.int64)
        ids = tl.load(table_ptr + token * stride_t + rk, mask=k_ok, other=0).to(tl.int64)
        picked = tl.sum(tl.where(re[None, :] == ids[:, None], s[None, :], 0.0), axis=1)
    else:
        sel = tl.where(ok, s + tl.load(bias_ptr + re, mask=ok, other=0.0).to(tl.float32),
                       float("-inf"))
        ids = tl.zeros([BLOCK_K], dtype=tl.int64)
        picked = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k in range(top_k):
            best = tl.max(sel, axis=0)
            i = tl.min(tl.where(sel == best, re, BLOCK_E), axis=0)
            ids = tl.where(rk == k, i.to(tl.int64), ids)
            picked = tl.where(rk == k, tl.sum(tl.where(re == i, s, 0.0), axis=0), picked)
            sel = tl.where(re == i, float("-inf"), sel)
    picked = tl.where(k_ok, picked, 0.0)
    weights = picked / (tl.sum(picked, axis=0) + 1e-20) * scale
    tl.store(w_ptr + t * stride_w + rk, weights, mask=k_ok)
    tl.store(ids_ptr + t * stride_i + rk, ids, mask=k_ok)


@triton.jit
def _route_kernel(logits_ptr, bias_ptr, table_ptr, token_ptr, w_ptr, ids_ptr, E, top_k,
                  stride_l, stride_t, stride_w, stride_i, scale, HASH: tl.constexpr,
                  BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)  # the logits are the kernel before's
    t = tl.program_id(0).to(tl.int64)
    route_token(t, logits_ptr + t * stride_l, bias_ptr, table_ptr, token_ptr, w_ptr, ids_ptr,
                E, top_k, stride_t, stride_w, stride_i, scale, HASH, BLOCK_E, BLOCK_K, "")


def _route(logits: torch.Tensor, bias: torch.Tensor | None, table: torch.Tensor | None,
           token_ids: torch.Tensor | None, top_k: int,
           scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    t, e = logits.shape
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int64, device=logits.device)
    if t == 0:
        return weights, ids
    hashed = table is not None
    table_arg = table if table is not None else ids  # unread where not hashed
    _route_kernel[(t,)](
        logits, bias if bias is not None else logits, table_arg,
        token_ids if token_ids is not None else ids, weights, ids, e, top_k, logits.stride(0),
        table_arg.stride(0), weights.stride(0), ids.stride(0), float(scale), HASH=hashed,
        BLOCK_E=triton.next_power_of_2(e), BLOCK_K=triton.next_power_of_2(top_k),
        num_warps=4 if e > 64 else 1, **pdl_launch(logits))
    return weights, ids


def route_topk_triton(logits: torch.Tensor, bias: torch.Tensor, top_k: int,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`route_topk_ref`: logits [T, E] (any float dtype), bias [E] -> (weights [T, k] fp32,
    ids [T, k] int64)."""
    if bias.stride(0) != 1:
        bias = bias.contiguous()
    return _route(logits, bias, None, None, top_k, scale)


def route_hash_triton(logits: torch.Tensor, tid2eid: torch.Tensor, token_ids: torch.Tensor,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`route_hash_ref`: logits [T, E], the table [vocab, k] (any integer dtype), token ids
    [T] -> (weights [T, k] fp32, ids [T, k] int64). Ids are not checked (that would sync)."""
    if tid2eid.stride(1) != 1:
        tid2eid = tid2eid.contiguous()
    return _route(logits, None, tid2eid, token_ids, tid2eid.shape[1], scale)
