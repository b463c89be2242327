"""The device's ceilings, measured in the same run as the figures set beside them: memory read
bandwidth and dense matmul rate (DESIGN.md §8). A ratio to a ceiling holds across noisy
machines; an absolute time only on the same GPU."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

log = logging.getLogger("openinfer.bench")

# GPU: a read far larger than any cache, and matmuls big enough to reach the tensor-core peak.
GPU_READ_BYTES = 1 << 30
GPU_MATMUL_SIZE = 8192
# CPU: small on purpose; a CPU figure only sets the tiny test models in proportion.
CPU_READ_BYTES = 32 << 20
CPU_MATMUL_SIZE = 256


@dataclass(frozen=True, slots=True)
class Ceiling:
    device: str  # "cuda:0", "cpu"
    gpu: str | None  # torch.cuda.get_device_name; None on CPU
    read_gbps: float  # best-of bytes read per second by a sum over one large tensor, in GB/s
    matmul_tflops: float  # best-of 2*N^3 / seconds for N x N x N matmuls, in TFLOP/s
    read_bytes: int
    matmul_size: int
    dtype: str  # of both measurements

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def floor_seconds(self, bytes_read: int) -> float:
        """The least time reading `bytes_read` bytes can take at the measured bandwidth."""
        return bytes_read / (self.read_gbps * 1e9)


def measure_ceiling(device: torch.device) -> Ceiling:
    """A few hundred ms on a GPU (it must have ~1.5 GiB free), tens of ms on a CPU."""
    if device.type == "cuda":
        return _measure(device, torch.bfloat16, GPU_READ_BYTES, GPU_MATMUL_SIZE,
                        _CudaTimer(device))
    return _measure(device, torch.float32, CPU_READ_BYTES, CPU_MATMUL_SIZE, _cpu_best_seconds)


def local_ceiling() -> Ceiling | None:
    """This machine's current GPU, or None without one (the bench client may run anywhere)."""
    if not torch.cuda.is_available():
        return None
    try:
        return measure_ceiling(torch.device("cuda", torch.cuda.current_device()))
    except torch.cuda.OutOfMemoryError:
        # The server on this GPU may hold nearly all of it; the run goes on without ceilings.
        log.warning("no GPU memory free to measure the ceilings; reporting none")
        torch.cuda.empty_cache()
        return None


Timer = Callable[[Callable[[], object]], float]


def _measure(device: torch.device, dtype: torch.dtype, read_bytes: int, size: int,
             best_seconds: Timer) -> Ceiling:
    with torch.inference_mode():
        read_s = _read_seconds(device, dtype, read_bytes, best_seconds)
        matmul_s = _matmul_seconds(device, dtype, size, best_seconds)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # give it all back before the engine sizes its KV cache
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return Ceiling(
        device=str(device), gpu=name, read_gbps=read_bytes / read_s / 1e9,
        matmul_tflops=2 * size**3 / matmul_s / 1e12, read_bytes=read_bytes, matmul_size=size,
        dtype=str(dtype).removeprefix("torch."))


def _read_seconds(device: torch.device, dtype: torch.dtype, read_bytes: int,
                  best_seconds: Timer) -> float:
    # A sum reads every byte once and writes one scalar: as close to pure reading as it gets.
    x = torch.ones(read_bytes // dtype.itemsize, dtype=dtype, device=device)
    return best_seconds(lambda: x.sum(dtype=torch.float32))


def _matmul_seconds(device: torch.device, dtype: torch.dtype, size: int,
                    best_seconds: Timer) -> float:
    gen = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(size, size, dtype=dtype, device=device, generator=gen)
            for _ in range(2))
    out = torch.empty(size, size, dtype=dtype, device=device)
    return best_seconds(lambda: torch.matmul(a, b, out=out))


class _CudaTimer:
    """Best of `reps` groups of `inner` back-to-back calls, timed with CUDA events."""

    def __init__(self, device: torch.device, *, warmup: int = 3, inner: int = 10,
                 reps: int = 5) -> None:
        self.device, self.warmup, self.inner, self.reps = device, warmup, inner, reps

    def __call__(self, fn: Callable[[], object]) -> float:
        with torch.cuda.device(self.device):
            for _ in range(self.warmup):
                fn()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            best = math.inf
            for _ in range(self.reps):
                start.record()
                for _ in range(self.inner):
                    fn()
                end.record()
                end.synchronize()
                best = min(best, start.elapsed_time(end) / 1000 / self.inner)
        return best


def _cpu_best_seconds(fn: Callable[[], object], reps: int = 5) -> float:
    fn()
    best = math.inf
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
