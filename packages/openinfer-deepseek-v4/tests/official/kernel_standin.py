"""A plain-torch stand-in for the `kernel` module that DeepSeek's official `inference/model.py`
imports (its TileLang kernels), so that the official model runs on CPU in fp32. Written from
the kernels' semantics (spec: shared deepseek-v4.md §5.3, §4.1, §10.3, §15); only what a model
built with bf16 weights (`ModelArgs(dtype="bf16", expert_dtype=None)`) calls is provided.

`QUANT_SIM` switches the in-graph fake quantization (FP8 e4m3 of the KV's non-rotary dims, FP4
e2m1 of the indexer's queries and keys): off, `act_quant` and `fp4_act_quant` leave their
input unchanged; on, they round it as the official kernels do. The environment variable
`OPENINFER_OFFICIAL_QUANT_SIM=1` turns it on at import; the generator sets the attribute."""

from __future__ import annotations

import os
from functools import lru_cache

import torch

QUANT_SIM = os.environ.get("OPENINFER_OFFICIAL_QUANT_SIM", "0") == "1"

FP8_MAX = 448.0
FP4_MAX = 6.0
# The kernels multiply by the reciprocal of the format's maximum, rounded to fp32.
_FP8_MAX_INV = torch.tensor(1.0 / FP8_MAX, dtype=torch.float32)
_FP4_MAX_INV = torch.tensor(1.0 / FP4_MAX, dtype=torch.float32)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.shape[-1] % block:
        raise ValueError(f"last dim {x.shape[-1]} is not a multiple of the block {block}")
    return x.float().unflatten(-1, (-1, block))


def _pow2_ceil(v: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 v) for v > 0 (fp32), as the kernels' bit trick computes it: the exponent,
    plus one unless the mantissa is zero (an exact power of two); subnormals count as 2^-126."""
    mantissa, exponent = torch.frexp(v)  # v = mantissa * 2^exponent, mantissa in [0.5, 1)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent).clamp(min=-126)
    return torch.ldexp(torch.ones_like(v), exponent)


def act_quant(x: torch.Tensor, block_size: int = 128, scale_fmt: str | None = None,
              scale_dtype: torch.dtype = torch.float32, inplace: bool = False) -> torch.Tensor:
    """In place (the only form a bf16-weight model calls): per block of `block_size` values
    along the last dim, s = max(amax, 1e-4) / 448 (rounded up to a power of two when
    `scale_fmt` is set), x <- e4m3(clamp(x / s, ±448)) * s. Unchanged without QUANT_SIM."""
    if not inplace:
        raise NotImplementedError("only the in-place fake quantization is stood in for: build "
                                  "the official model with bf16 weights")
    if not QUANT_SIM:
        return x
    blocks = _blocks(x, block_size)
    amax = blocks.abs().amax(-1, keepdim=True).clamp(min=1e-4)
    scale = amax * _FP8_MAX_INV
    if scale_fmt is not None:
        scale = _pow2_ceil(scale)
    codes = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    x.copy_((codes.float() * scale).flatten(-2))
    return x


def e2m1_round(v: torch.Tensor) -> torch.Tensor:
    """Round fp32 values in [-6, 6] to the nearest e2m1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6 and
    their negatives), ties to the even mantissa. The grid's spacing is 0.5 below 2, 1 below 4
    and 2 above, and an even multiple of the spacing is an even mantissa, so round-half-even
    of v / spacing is the format's rounding."""
    a = v.abs()
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    return torch.copysign(torch.round(a / step) * step, v)


def fp4_act_quant(x: torch.Tensor, block_size: int = 32, inplace: bool = False) -> torch.Tensor:
    """In place: per block, s = 2^ceil(log2(max(amax, 6 * 2^-126) / 6)),
    x <- e2m1(clamp(x / s, ±6)) * s. Unchanged without QUANT_SIM."""
    if not inplace:
        raise NotImplementedError("only the in-place fake quantization is stood in for")
    if not QUANT_SIM:
        return x
    blocks = _blocks(x, block_size)
    amax = blocks.abs().amax(-1, keepdim=True).clamp(min=FP4_MAX * 2.0 ** -126)
    scale = _pow2_ceil(amax * _FP4_MAX_INV)
    x.copy_((e2m1_round((blocks / scale).clamp(-FP4_MAX, FP4_MAX)) * scale).flatten(-2))
    return x


def fp8_gemm(*args: object, **kwargs: object) -> torch.Tensor:
    raise NotImplementedError("FP8 weights are not stood in for: build the official model "
                              "with bf16 weights (ModelArgs(dtype='bf16'))")


def fp4_gemm(*args: object, **kwargs: object) -> torch.Tensor:
    raise NotImplementedError("FP4 experts are not stood in for: build the official model "
                              "with ModelArgs(expert_dtype=None)")


def sparse_attn(q: torch.Tensor, kv: torch.Tensor, attn_sink: torch.Tensor,
                topk_idxs: torch.Tensor, scale: float) -> torch.Tensor:
    """q [b, m, h, d]; kv [b, n, d] (keys and values); attn_sink [h]; topk_idxs [b, m, k] rows
    of kv, -1 masked -> [b, m, h, d] in q's dtype. Each query's softmax runs over its gathered
    rows with its head's sink logit in the denominator (a zero value), in fp32; the maximum is
    taken over the rows only, as in the kernel."""
    b = torch.arange(kv.shape[0], device=kv.device)[:, None, None]
    idx = topk_idxs.long()
    rows = kv.float()[b, idx.clamp(min=0)]  # [b, m, k, d]
    scores = torch.einsum("bmhd,bmkd->bmhk", q.float(), rows) * scale
    scores = scores.masked_fill((idx < 0)[:, :, None, :], float("-inf"))
    peak = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - peak)
    total = weights.sum(-1, keepdim=True) + torch.exp(attn_sink.float()[:, None] - peak)
    return (torch.einsum("bmhk,bmkd->bmhd", weights, rows) / total).to(q.dtype)


def hc_split_sinkhorn(mixes: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                      hc_mult: int = 4, sinkhorn_iters: int = 20, eps: float = 1e-6
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mixes [b, s, (2 + n) n] -> (pre [b, s, n], post [b, s, n], comb [b, s, n, n]), fp32, in
    the kernel's order: pre = sigmoid(. * scale0 + base) + eps, post = 2 sigmoid(. * scale1 +
    base), comb = row softmax + eps, a column normalisation, then (iters - 1) times a row and
    a column normalisation, each dividing by (sum + eps)."""
    n = hc_mult
    mixes, hc_scale, hc_base = mixes.float(), hc_scale.float(), hc_base.float()
    pre = torch.sigmoid(mixes[..., :n] * hc_scale[0] + hc_base[:n]) + eps
    post = 2 * torch.sigmoid(mixes[..., n:2 * n] * hc_scale[1] + hc_base[n:2 * n])
    comb = (mixes[..., 2 * n:] * hc_scale[2] + hc_base[2 * n:]).unflatten(-1, (n, n))
    comb = torch.exp(comb - comb.amax(-1, keepdim=True))
    comb = comb / comb.sum(-1, keepdim=True) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


@lru_cache(4)
def _sylvester(n: int) -> torch.Tensor:
    if n & (n - 1):
        raise ValueError(f"the Hadamard transform needs a power-of-two size, got {n}")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def hadamard_transform(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The Walsh-Hadamard transform of the last dim in Sylvester order, times `scale`
    (fast_hadamard_transform's contract), in x's dtype."""
    h = _sylvester(x.shape[-1]).to(x.device)
    return (torch.nn.functional.linear(x.float(), h) * scale).to(x.dtype)
