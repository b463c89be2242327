"""Manifold-constrained hyper-connections (mHC), DeepSeek-V4's residual: each token carries N
residual streams ([T, N, D]). Around each sublayer (attention, MoE) the streams give three sets
of weights through one small projection of all of them: `pre` collapses the streams into the
sublayer's input, `post` spreads its output back over the streams, and `comb`, a matrix made
doubly stochastic by Sinkhorn-Knopp iterations, mixes the streams into themselves:

    u = sum_i pre_i H_i;   H'_k = post_k f(u) + sum_j comb[j, k] H_j

(spec: shared deepseek-v4.md §4). The weights are computed in fp32 from the fp32 streams.

`hc_pre_ref` and `hc_post_ref` are one sublayer's step split around the sublayer, composed
exactly as the model's `around` composes the pieces: the Triton path's oracle. The split puts
comb's softmax and Sinkhorn-Knopp iterations in `hc_post_ref` (hc_pre hands over comb's
logits), where the Triton path runs them: the same operations on the same values as
`hc_weights_ref`, so the same bits."""

from __future__ import annotations

import torch


def _mixes(streams: torch.Tensor, fn: torch.Tensor, norm_eps: float) -> torch.Tensor:
    """[T, N, D] streams flattened to [T, N*D] in fp32, RMS-normalised without a weight, then
    projected by `fn` ([M, N*D]): [T, M] fp32."""
    flat = streams.reshape(streams.shape[0], -1).float()
    flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    return flat @ fn.float().t()


def hc_weights_ref(streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor,
                   scale: torch.Tensor, *, hc_eps: float, norm_eps: float,
                   sinkhorn_iters: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """streams [T, N, D]; fn [(2 + N) N, N D], base [(2 + N) N], scale [3] (pre, post, comb) ->
    (pre [T, N], post [T, N], comb [T, N, N]), fp32 (`comb_ref` of the logits)."""
    pre, post, logits = _weights_and_logits(streams, fn, base, scale, hc_eps, norm_eps)
    return pre, post, comb_ref(logits, hc_eps=hc_eps, sinkhorn_iters=sinkhorn_iters)


def _weights_and_logits(streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor,
                        scale: torch.Tensor, hc_eps: float, norm_eps: float
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre [T, N], post [T, N], comb's logits [T, N, N]), fp32."""
    n = streams.shape[1]
    pre_w, post_w, comb_w = _mixes(streams, fn, norm_eps).split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = base.float().split([n, n, n * n])
    scale = scale.float()
    pre = torch.sigmoid(pre_w * scale[0] + pre_b) + hc_eps
    post = 2 * torch.sigmoid(post_w * scale[1] + post_b)
    return pre, post, comb_w.view(-1, n, n) * scale[2] + comb_b.view(n, n)


def comb_ref(logits: torch.Tensor, *, hc_eps: float, sinkhorn_iters: int) -> torch.Tensor:
    """comb [T, N, N] fp32 from its logits: rows softmaxed (+ hc_eps), then normalised
    alternately by columns and rows (`sinkhorn_iters` column passes)."""
    comb = torch.softmax(logits, dim=-1) + hc_eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    return comb


def hc_collapse_ref(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """sum_i pre_i H_i: [T, N, D] -> [T, D] in the streams' dtype (summed in fp32)."""
    return (pre.unsqueeze(-1) * streams.float()).sum(dim=1).to(streams.dtype)


def hc_expand_ref(streams: torch.Tensor, out: torch.Tensor, post: torch.Tensor,
                  comb: torch.Tensor) -> torch.Tensor:
    """H'_k = post_k out + sum_j comb[j, k] H_j: the sublayer output `out` ([T, D]) back into
    the streams ([T, N, D]), in their dtype, the weights rounded to it first (as transformers
    does)."""
    dtype = streams.dtype
    return (post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2)
            + torch.matmul(comb.to(dtype).transpose(-1, -2), streams))


def hc_head_ref(streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor,
                scale: torch.Tensor, *, hc_eps: float, norm_eps: float,
                norm_weight: torch.Tensor | None = None) -> torch.Tensor:
    """The final collapse: pre = sigmoid(mix * scale + base) + hc_eps (fn [N, N D], base [N],
    scale [1]), then `hc_collapse_ref`: [T, N, D] -> [T, D]; with `norm_weight` [D] also the
    model's last RMSNorm of it (`rms_norm_ref`)."""
    pre = torch.sigmoid(_mixes(streams, fn, norm_eps) * scale.float() + base.float()) + hc_eps
    collapsed = hc_collapse_ref(streams, pre)
    return collapsed if norm_weight is None else rms_norm_ref(collapsed, norm_weight, norm_eps)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The model's RMSNorm: in fp32, times the fp32 weight, rounded to x's dtype once."""
    normed = x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps)
    return (weight.float() * normed).to(x.dtype)


def hc_pre_ref(streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
               norm_weight: torch.Tensor, *, hc_eps: float, norm_eps: float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Everything before a sublayer: the weights (`hc_weights_ref`, comb's logits for
    `hc_post_ref`), the collapse, and the layer's RMSNorm (weight norm_weight [D]) of the
    collapsed vector, in fp32 and rounded to the streams' dtype once at the end, as the model's
    `rms_norm` does. streams [T, N, D] -> (x [T, D] in the streams' dtype: the sublayer's
    input, post [T, N] fp32, comb's logits [T, N, N] fp32). `norm_eps` serves both norms, as
    in the model."""
    pre, post, logits = _weights_and_logits(streams, fn, base, scale, hc_eps, norm_eps)
    return rms_norm_ref(hc_collapse_ref(streams, pre), norm_weight, norm_eps), post, logits


def hc_post_ref(streams: torch.Tensor, out: torch.Tensor, post: torch.Tensor,
                comb_logits: torch.Tensor, *, hc_eps: float, sinkhorn_iters: int
                ) -> torch.Tensor:
    """Everything after a sublayer: `hc_expand_ref` of its output out [T, D] with hc_pre's post
    [T, N] and comb (`comb_ref` of hc_pre's logits [T, N, N]) -> the new streams [T, N, D] (a
    new tensor)."""
    return hc_expand_ref(streams, out, post,
                         comb_ref(comb_logits, hc_eps=hc_eps, sinkhorn_iters=sinkhorn_iters))
