"""Summaries of latency samples, computed as numpy does (what `vllm bench serve` reports), in
plain Python so the bench client needs no numpy."""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def std(values: Sequence[float]) -> float:
    """Population standard deviation (numpy's default, ddof=0)."""
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / len(values))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between the closest ranks,
    numpy.percentile's default method."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def percentile_name(q: float) -> str:
    """vLLM's key spelling: 99 -> 'p99', 99.9 -> 'p99.9'."""
    return f"p{int(q)}" if int(q) == q else f"p{q}"


def summarize_ms(name: str, seconds: Sequence[float],
                 percentiles: Sequence[float] = (99.0,)) -> dict[str, float]:
    """`mean_<name>_ms`, `median_<name>_ms`, `std_<name>_ms` and `p<q>_<name>_ms` of samples
    given in seconds. No samples count as one zero, as vLLM reports them."""
    ms = [s * 1000.0 for s in seconds] or [0.0]
    out = {f"mean_{name}_ms": mean(ms), f"median_{name}_ms": median(ms),
           f"std_{name}_ms": std(ms)}
    for q in percentiles:
        out[f"{percentile_name(q)}_{name}_ms"] = percentile(ms, q)
    return out
