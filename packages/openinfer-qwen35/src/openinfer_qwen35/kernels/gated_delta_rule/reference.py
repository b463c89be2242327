"""The gated delta rule (Gated DeltaNet's token mixer), fp32, in two forms that must agree: the
recurrence, one token at a time (decode), and the chunked form (prompts), which solves each
chunk's updates with one triangular system instead of a loop over its tokens.

Per value head, with state S [K, V] (keys x values), for each token t:
    S <- exp(g_t) * S                             (decay; g_t <= 0)
    u_t = beta_t * (v_t - S^T k_t)                (the delta: what S mispredicts for k_t)
    S <- S + k_t u_t^T
    o_t = S^T (q_t * scale)
q and k are L2-normalised first (`l2norm`). Query/key heads are shared by
`value_heads // key_heads` consecutive value heads (grouped value attention)."""

from __future__ import annotations

from itertools import pairwise

import torch


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dimension, in fp32."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _heads(q: torch.Tensor, k: torch.Tensor, value_heads: int,
           scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised q (scaled) and k, their heads repeated to one per value head."""
    group = value_heads // q.shape[-2]
    q, k = l2norm(q) * scale, l2norm(k)
    return q.repeat_interleave(group, dim=-2), k.repeat_interleave(group, dim=-2)


def gated_delta_rule_recurrent_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                   g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                                   scale: float | None = None) -> torch.Tensor:
    """N sequences of L tokens, one token at a time: q, k [N, L, H, K], v [N, L, HV, V],
    g and beta [N, L, HV], state [N, HV, K, V] fp32 (updated in place to the state after the
    last token). Returns the outputs [N, L, HV, V] in v's dtype."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k = _heads(q, k, v.shape[-2], scale)
    vf, g, beta = v.float(), g.float(), beta.float()
    s = state.float()
    out = torch.empty(vf.shape, dtype=torch.float32, device=v.device)
    for t in range(v.shape[1]):
        s = s * g[:, t].exp()[..., None, None]
        predicted = torch.einsum("nhkv,nhk->nhv", s, k[:, t])
        delta = (vf[:, t] - predicted) * beta[:, t, :, None]
        s = s + k[:, t, :, :, None] * delta[:, :, None, :]
        out[:, t] = torch.einsum("nhkv,nhk->nhv", s, q[:, t])
    state.copy_(s)
    return out.to(v.dtype)


def gated_delta_rule_chunk_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                               scale: float | None = None, chunk: int = 64) -> torch.Tensor:
    """`gated_delta_rule_recurrent_ref`'s result, a chunk of tokens at a time.

    Within a chunk starting from state S0, with G_t the decay summed (in log space) from the
    chunk's start to t, the deltas U solve the unit lower-triangular system
        (I + A) U = beta * (V - exp(G) * K S0),  A[t, j] = beta_t exp(G_t - G_j) k_t.k_j, j < t
    and then
        O = exp(G) * Q S0 + (Q K^T * exp(G_t - G_j), j <= t) U
        S = exp(G_last) S0 + sum_j exp(G_last - G_j) k_j u_j^T."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k = _heads(q, k, v.shape[-2], scale)
    # Heads first: [N, HV, L, ...].
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    vf = v.float().transpose(1, 2)
    g, beta = g.float().transpose(1, 2), beta.float().transpose(1, 2)
    s = state.float()
    length = v.shape[1]
    out = torch.empty(vf.shape, dtype=torch.float32, device=v.device)
    for start in range(0, length, chunk):
        end = min(start + chunk, length)
        qc, kc, vc = q[:, :, start:end], k[:, :, start:end], vf[:, :, start:end]
        bc = beta[:, :, start:end, None]
        cum = g[:, :, start:end].cumsum(dim=-1)  # G_t
        n = end - start
        lower = torch.ones(n, n, dtype=torch.bool, device=v.device).tril()
        decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()
        a = torch.tril(bc * kc @ kc.transpose(-1, -2) * decay, diagonal=-1)
        a = a + torch.eye(n, device=v.device)
        rhs = bc * (vc - cum.exp()[..., None] * (kc @ s))
        u = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
        out[:, :, start:end] = (cum.exp()[..., None] * (qc @ s)
                                + (qc @ kc.transpose(-1, -2) * decay) @ u)
        last = cum[..., -1:]
        s = (s * last.exp()[..., None]
             + (kc * (last - cum).exp()[..., None]).transpose(-1, -2) @ u)
    state.copy_(s)
    return out.transpose(1, 2).to(v.dtype)


def gated_delta_rule_varlen_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                g: torch.Tensor, beta: torch.Tensor, states: torch.Tensor,
                                slots: torch.Tensor, fresh: torch.Tensor,
                                query_start_loc: torch.Tensor, decode: bool) -> torch.Tensor:
    """The rule over a flattened batch: q, k [T, H, K], v [T, HV, V], g, beta [T, HV]; row b
    (tokens `query_start_loc[b]:query_start_loc[b + 1]`) starts from state `states[slots[b]]`
    (zeros where `fresh[b]`) and leaves its final state there. `decode`: every row has one
    token (one batched step). Rows with no tokens keep their slot's state (zeroed where
    fresh); tokens past `query_start_loc[-1]` (a mixed CUDA graph's padding) read and write no
    state and come out as zeros. Returns [T, HV, V] in v's dtype; mutates `states`."""
    initial = states[slots.long()] * (~fresh).to(states.dtype)[:, None, None, None]
    if decode:
        out = gated_delta_rule_recurrent_ref(q[:, None], k[:, None], v[:, None], g[:, None],
                                             beta[:, None], initial)[:, 0]
    else:
        out = torch.zeros_like(v)
        bounds = query_start_loc.tolist()
        for b, (start, end) in enumerate(pairwise(bounds)):
            rule = gated_delta_rule_recurrent_ref if end - start == 1 else (
                gated_delta_rule_chunk_ref)
            row = slice(start, end)
            out[row] = rule(q[None, row], k[None, row], v[None, row], g[None, row],
                            beta[None, row], initial[b:b + 1])[0]
    states[slots.long()] = initial.to(states.dtype)
    return out
