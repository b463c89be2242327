"""The bench's arithmetic: summaries against numpy, the random dataset, Poisson arrivals."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest

from openinfer_server.bench.dataset import random_requests, sample_lengths
from openinfer_server.bench.serve_client import arrival_offsets
from openinfer_server.bench.stats import (
    mean,
    median,
    percentile,
    percentile_name,
    std,
    summarize_ms,
)

SAMPLES = {
    "one": [3.5],
    "two": [1.0, 2.0],
    "odd": [5.0, 1.0, 4.0, 2.0, 3.0],
    "ties": [2.0, 2.0, 2.0, 7.0],
    "spread": [random.Random(7).lognormvariate(0, 1) for _ in range(101)],
}


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 99.9, 100])
def test_percentile_is_numpys(name: str, q: float) -> None:
    values = SAMPLES[name]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)


@pytest.mark.parametrize("name", SAMPLES)
def test_mean_median_std_are_numpys(name: str) -> None:
    values = SAMPLES[name]
    assert mean(values) == pytest.approx(float(np.mean(values)), rel=1e-12)
    assert median(values) == pytest.approx(float(np.median(values)), rel=1e-12)
    assert std(values) == pytest.approx(float(np.std(values)), rel=1e-9, abs=1e-12)


def test_percentile_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"in \[0, 100\]"):
        percentile([1.0], 101)


def test_summary_keys_and_units_are_vllms() -> None:
    seconds = [0.010, 0.020, 0.030, 0.040]
    summary = summarize_ms("ttft", seconds, (50, 99, 99.9))
    assert summary == pytest.approx({
        "mean_ttft_ms": 25.0, "median_ttft_ms": 25.0,
        "std_ttft_ms": float(np.std(seconds)) * 1000,
        "p50_ttft_ms": 25.0, "p99_ttft_ms": float(np.percentile(seconds, 99)) * 1000,
        "p99.9_ttft_ms": float(np.percentile(seconds, 99.9)) * 1000})
    # No samples report zeros, as vLLM's `np.mean(x or 0)` does.
    assert set(summarize_ms("tpot", []).values()) == {0.0}
    assert [percentile_name(q) for q in (99, 99.0, 99.9, 50)] == ["p99", "p99", "p99.9", "p50"]


def test_random_requests_are_seeded_exact_and_distinct() -> None:
    first = random_requests(20, 32, 8, vocab_size=1000, seed=3)
    assert first == random_requests(20, 32, 8, vocab_size=1000, seed=3)
    assert first != random_requests(20, 32, 8, vocab_size=1000, seed=4)
    assert all(r.prompt_len == 32 and r.output_len == 8 for r in first)
    assert all(0 <= t < 1000 for r in first for t in r.prompt_token_ids)
    # Random prompts share no first block, so the prefix cache cannot shorten a prefill.
    assert len({r.prompt_token_ids[:16] for r in first}) == 20


def test_range_ratio_spreads_lengths_like_vllm() -> None:
    rng = random.Random(0)
    lengths = sample_lengths(rng, 100, 0.5, 5000)
    assert min(lengths) == 50 and max(lengths) == 150
    assert statistics.mean(lengths) == pytest.approx(100, rel=0.02)
    assert min(sample_lengths(rng, 3, 0.9, 200)) >= 1  # never an empty prompt
    assert sample_lengths(rng, 7, 0.0, 3) == [7, 7, 7]


def test_poisson_arrivals_are_seeded_with_the_right_mean() -> None:
    rate = 20.0
    offsets = arrival_offsets(4000, rate, seed=11)
    assert offsets == arrival_offsets(4000, rate, seed=11)
    assert offsets != arrival_offsets(4000, rate, seed=12)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    gaps = np.diff(offsets)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
    # Exponential gaps: the standard deviation equals the mean.
    assert gaps.std() == pytest.approx(1 / rate, rel=0.1)
    assert arrival_offsets(5, math.inf, seed=0) == [0.0] * 5
