"""Sampling one token per row by an exponential race, without a softmax.

For a row with logits x at temperature T, draw E_v ~ Exp(1) independently for every token and
pick argmax_v (x_v / T - log E_v). Since argmax(p_v / E_v) is an exact draw from p = softmax(x / T)
and log is increasing, so is this; the normaliser of p is a constant shift and drops out.

The noise is a function of (row seed, token id) only, so a row's draw does not depend on the rest
of the batch. This reference feeds the seed to a torch.Generator; the Triton kernel feeds it to
Philox. The two therefore pick different tokens for the same seed, from the same distribution —
as in vLLM, a seed reproduces a run on the same device kind, not across CPU and GPU.
"""

from __future__ import annotations

import math

import torch

_MASK64 = (1 << 64) - 1


def race_sample_ref(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    min_p: torch.Tensor | None,
    seeds: torch.Tensor,
) -> torch.Tensor:
    """One token id per row ([B] int64) from logits [B, V] (any float dtype, read as fp32).

    temperature [B] fp32: a row with temperature <= 0 is greedy (argmax, lowest id on ties).
    min_p [B] fp32 or None (no row filters): a random row keeps only tokens with
        x / T >= max(x / T) + log(min_p), i.e. probability >= min_p * the top probability;
        min_p = 0 keeps every token. A -inf logit is never chosen unless the whole row is -inf.
    seeds [B] int64: the row's noise stream (read as its 64 bits, so negative seeds are fine).
    """
    x = logits.float()
    out = torch.empty(x.shape[0], dtype=torch.int64)
    for row in range(x.shape[0]):
        t = float(temperature[row])
        if t <= 0.0:
            out[row] = x[row].argmax()  # the first maximum: the lowest id
            continue
        z = x[row] / t
        floor = 0.0 if min_p is None else float(min_p[row])
        if floor > 0.0:
            z = z.masked_fill(z < z.max() + math.log(floor), float("-inf"))
        gen = torch.Generator(device=x.device)
        gen.manual_seed(int(seeds[row]) & _MASK64)
        e = torch.empty_like(z).exponential_(generator=gen)
        # A zero draw would give log 0 = -inf and a -inf - (-inf) = NaN score for a masked token.
        e.clamp_(min=torch.finfo(torch.float32).tiny)
        out[row] = (z - e.log()).argmax()
    return out.to(logits.device)


def top_p_nucleus(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """fp32 logits with every id outside its row's top-p nucleus at -inf: the nucleus is the
    smallest prefix, in stable descending order (ties: lower id first), whose probability
    reaches top_p; an id is in it when the mass strictly above it is below top_p."""
    x = logits.float()
    sorted_x, order = x.sort(dim=-1, descending=True, stable=True)
    probs = sorted_x.softmax(dim=-1)
    outside = (probs.cumsum(dim=-1) - probs) >= top_p.float().unsqueeze(1)
    return torch.empty_like(x).scatter_(-1, order, sorted_x.masked_fill(outside, float("-inf")))


def top_p_sample_ref(logits: torch.Tensor, top_p: torch.Tensor,
                     seeds: torch.Tensor) -> torch.Tensor:
    """One token id per row ([B] int64): `race_sample_ref` at temperature 1 over each row's top-p
    nucleus (`top_p_nucleus`). `logits` [B, V] are already divided by the temperature (and
    min_p-filtered); top_p [B] in (0, 1]; seeds [B] int64 as `race_sample_ref`'s."""
    ones = torch.ones(logits.shape[0], dtype=torch.float32, device=logits.device)
    return race_sample_ref(top_p_nucleus(logits, top_p), ones, None, seeds)
