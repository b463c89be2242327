"""Does the sampler draw from the distribution the parameters describe?

For each parameter set, one batched call samples the same row many times, and a chi-square
goodness-of-fit test compares the counts with a distribution computed here, independently, in
numpy float64 from the written semantics. Seeds are fixed, so the p-values are deterministic; the
1e-3 threshold leaves room for a correct sampler while a wrong one lands far below it (see
test_chi_square_rejects_a_wrong_temperature).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from openinfer_core.params import SamplingParams
from openinfer_core.sampling.sampler import Sampler, SamplingRow

# Distinct values in a shuffled order, so a sampler that confuses sorted rank with token id fails.
LOGITS = np.array([0.3, -1.1, 2.0, 0.9, -2.5, 1.5, 0.0, -0.4, 1.2, -1.7, 0.5, -0.8])
VOCAB = len(LOGITS)
N = 20_000
PROMPT = (2, 3, 3)
OUTPUT = (5, 5, 1, 8)


def reference_probs(logits: np.ndarray, p: SamplingParams, prompt: tuple[int, ...] = (),
                    output: tuple[int, ...] = ()) -> np.ndarray:
    """The target distribution, straight from the semantics (vLLM's), in float64."""
    x = logits.astype(np.float64).copy()
    counts = np.bincount(np.array(output, dtype=np.int64), minlength=len(x)).astype(np.float64)
    seen = counts > 0
    seen[list(prompt)] = True
    r = p.repetition_penalty
    x = np.where(seen, np.where(x > 0, x / r, x * r), x)
    x = x - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)

    x = x / p.temperature
    keep = np.ones(len(x), dtype=bool)
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    keep &= probs >= p.min_p * probs.max()
    if p.top_k > 1:
        kth_largest = np.sort(np.where(keep, x, -np.inf))[::-1][p.top_k - 1]
        keep &= x >= kth_largest
    probs = np.where(keep, np.exp(x - x.max()), 0.0)
    probs /= probs.sum()
    if p.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        mass_above = np.cumsum(probs[order]) - probs[order]
        nucleus = order[mass_above < p.top_p]
        probs = np.where(np.isin(np.arange(len(x)), nucleus), probs, 0.0)
        probs /= probs.sum()
    return probs


def draw(params: SamplingParams, n: int = N, seed: int = 0, prompt: tuple[int, ...] = (),
         output: tuple[int, ...] = ()) -> np.ndarray:
    """Counts per token id of `n` samples of the same row, drawn in one batched call."""
    logits = torch.tensor(LOGITS, dtype=torch.float32).expand(n, VOCAB).contiguous()
    rows = [SamplingRow(params, prompt, output)] * n
    tokens = [t.token_id for t in Sampler(VOCAB, seed=seed).sample(logits, rows)]
    return np.bincount(np.array(tokens), minlength=VOCAB)


def fit_p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value over the support of `probs`; counts outside it must be zero."""
    support = probs > 0
    assert counts[~support].sum() == 0, f"filtered-out tokens sampled: {counts[~support]}"
    expected = probs[support] * counts.sum()
    assert expected.min() >= 5, "too few samples for a chi-square test; raise N"
    return float(chisquare(counts[support], expected).pvalue)


CASES: dict[str, dict[str, Any]] = {
    "temperature 0.7": dict(temperature=0.7),
    "temperature 1.5": dict(temperature=1.5),
    "top_k 3": dict(top_k=3),
    "top_p 0.8": dict(top_p=0.8),
    "min_p 0.2": dict(min_p=0.2),
    "top_k 5 + top_p 0.7, T 0.9": dict(temperature=0.9, top_k=5, top_p=0.7),
    "min_p 0.05 + top_k 6 + top_p 0.9, T 1.3": dict(temperature=1.3, min_p=0.05, top_k=6,
                                                    top_p=0.9),
    "penalties, T 1.2": dict(temperature=1.2, repetition_penalty=1.4, frequency_penalty=0.3,
                             presence_penalty=0.2),
}


@pytest.mark.parametrize("kwargs", CASES.values(), ids=CASES.keys())
def test_samples_fit_the_reference_distribution(kwargs: dict[str, Any]) -> None:
    params = SamplingParams(**kwargs)
    probs = reference_probs(LOGITS, params, PROMPT, OUTPUT)
    counts = draw(params, prompt=PROMPT, output=OUTPUT)
    assert fit_p_value(counts, probs) > 1e-3


def test_filters_actually_filter() -> None:
    """Guards the cases above against vacuity: each filter removes tokens in the reference."""
    for name in ("top_k 3", "top_p 0.8", "min_p 0.2", "top_k 5 + top_p 0.7, T 0.9"):
        probs = reference_probs(LOGITS, SamplingParams(**CASES[name]), PROMPT, OUTPUT)
        assert 0 < (probs > 0).sum() < VOCAB - 2, name


def test_seeded_rows_fit_the_reference_distribution() -> None:
    """Rows with their own seeds take the per-row generator path; it must sample correctly too."""
    n = 3000
    base = dict(temperature=1.5, top_p=0.95)
    logits = torch.tensor(LOGITS, dtype=torch.float32).expand(n, VOCAB).contiguous()
    rows = [SamplingRow(SamplingParams(seed=s, **base), (), ()) for s in range(n)]
    tokens = [t.token_id for t in Sampler(VOCAB).sample(logits, rows)]
    counts = np.bincount(np.array(tokens), minlength=VOCAB)
    probs = reference_probs(LOGITS, SamplingParams(**base))
    assert fit_p_value(counts, probs) > 1e-3


def test_chi_square_rejects_a_wrong_temperature() -> None:
    """The same test, fed samples drawn at temperature 1.0, must reject the 0.7 distribution."""
    counts = draw(SamplingParams(temperature=1.0))
    wrong = reference_probs(LOGITS, SamplingParams(temperature=0.7))
    right = reference_probs(LOGITS, SamplingParams(temperature=1.0))
    assert fit_p_value(counts, right) > 1e-3
    assert fit_p_value(counts, wrong) < 1e-6


def test_chi_square_rejects_ignored_penalties() -> None:
    """Samples drawn with the penalties left out must not fit the penalised distribution."""
    params = SamplingParams(**CASES["penalties, T 1.2"])
    counts = draw(SamplingParams(temperature=1.2))
    assert fit_p_value(counts, reference_probs(LOGITS, params, PROMPT, OUTPUT)) < 1e-6
