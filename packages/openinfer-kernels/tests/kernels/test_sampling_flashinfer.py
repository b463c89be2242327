"""FlashInfer's top-k / top-p draw (`FlashInferSamplingKernels`) draws from the distribution the
Sampler's own filter defines: the top_k largest ids, then the top_p nucleus of those, renormalised.
Chi-square over many rows of the same logits; GPU only, skipped without flashinfer-python."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    importlib.util.find_spec("flashinfer") is None or not torch.cuda.is_available(),
    reason="needs flashinfer-python and a GPU")]

LOGITS = np.random.default_rng(1).permutation(np.linspace(-2.0, 2.0, 50))


def expected(top_k: int, top_p: float) -> np.ndarray:
    order = np.argsort(-LOGITS, kind="stable")
    p = np.exp(LOGITS - LOGITS.max())
    kept = np.zeros_like(p)
    kept[order[:top_k]] = p[order[:top_k]]
    kept /= kept.sum()
    mass_above = np.cumsum(kept[order]) - kept[order]
    nucleus = np.zeros_like(p)
    inside = order[mass_above < top_p]
    nucleus[inside] = kept[inside]
    return nucleus / nucleus.sum()


@pytest.mark.parametrize(("top_k", "top_p"), [(20, 1.0), (50, 0.7), (12, 0.9)])
def test_flashinfer_draws_the_filtered_distribution(top_k: int, top_p: float) -> None:
    from openinfer_kernels.sampling.flashinfer import FlashInferSamplingKernels

    n = 40_000
    kernels = FlashInferSamplingKernels()
    kernels.warm_up(torch.device("cuda"), len(LOGITS))
    x = torch.tensor(LOGITS, dtype=torch.float32, device="cuda").expand(n, -1).contiguous()
    k = torch.full((n,), top_k, dtype=torch.int32, device="cuda")
    p = torch.full((n,), top_p, device="cuda")
    ids = kernels.top_k_top_p_sample(x, k, p, seed=top_k)
    assert torch.equal(ids, kernels.top_k_top_p_sample(x, k, p, seed=top_k))  # seeded
    assert ids.dtype == torch.int64 and ids.shape == (n,)
    want = expected(top_k, top_p)
    counts = np.bincount(ids.cpu().numpy(), minlength=len(LOGITS))
    assert counts[want == 0].sum() == 0  # nothing outside the kept set
    kept = want > 0
    assert chisquare(counts[kept], want[kept] * n).pvalue > 1e-3
