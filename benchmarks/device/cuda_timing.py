"""Timing on the GPU for the device benchmarks: CUDA-event medians, one call's share of a CUDA
graph of many, and the copy bandwidth that the bytes floors divide by (measured in the same
run, so a floor and the time beside it come from one machine)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch


def median_us(fn: Callable[[], object], reps: int = 50, warmup: int = 5) -> float:
    """Median microseconds of `fn` (CUDA events around each call)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def graph_per_call_us(calls: Sequence[Callable[[], object]], replays: int = 5) -> float:
    """One call's share of a CUDA graph of `calls` (each on its own inputs, so none is served
    from L2), best of `replays`: launch gaps and host time left out."""
    for call in calls:
        call()  # compiles, and sizes the graph's pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    best = float("inf")
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / len(calls))
    return best


def copy_bandwidth() -> float:
    """Bytes moved (read + written) per second by a 1 GiB device-to-device copy: the rate a
    kernel that only streams its inputs can at best read at."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = graph_per_call_us([lambda: dst.copy_(src)] * 4)
    return 2 * src.numel() / (us * 1e-6)
