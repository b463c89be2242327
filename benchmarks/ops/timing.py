"""The four ways an op's call is timed (`registry.Timing`), in microseconds a call. The CUDA
ones are benchmarks/device/cuda_timing.py's, which the device scripts share."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from benchmarks.device.cuda_timing import graph_per_call_us, median_us

Call = Callable[[], object]


def kernels_us(call: Call, reps: int = 10) -> float:
    """Device time of the kernels one call launches (the profiler's sum): what a CUDA graph
    replay of it costs, whatever the host's launch time."""
    call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / reps


def wall_us(call: Call, reps: int = 20) -> float:
    """Host wall time a call of back-to-back calls, the device drained at both ends: for calls
    that wait on the device themselves (a sampler handing ids to the host)."""
    call()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(reps):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / reps * 1e6


def time_us(timing: str, calls: Sequence[Call]) -> float:
    """`calls`: one per copy of the inputs (graph timing runs them all, the others the first)."""
    if timing == "graph":
        return graph_per_call_us(calls)
    if timing == "events":
        return median_us(calls[0])
    if timing == "kernels":
        return kernels_us(calls[0])
    if timing == "wall":
        return wall_us(calls[0])
    raise ValueError(f"unknown timing {timing!r}")
