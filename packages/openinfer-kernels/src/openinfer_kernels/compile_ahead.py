"""Compiling Triton kernels ahead, in parallel. Triton compiles a kernel variant the first time
it is launched (about 0.5-1 s each on the H100's host), so a cold start that captures a few
dozen CUDA graphs waits on some twenty compilations, one after the other. Within
`compile_ahead()` a launch only hands its variant to a thread pool (Triton's own
`AsyncCompileMode`) and launches nothing; leaving it waits for every compilation and keeps the
results, so the real launches that follow find them compiled. Torch ops run as usual inside
(over whatever the skipped kernels left in their outputs): a forward run there must not act on
its results."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor


@contextlib.contextmanager
def compile_ahead(workers: int | None = None) -> Iterator[None]:
    """Within: Triton launches compile (in `workers` threads, default one per core up to 16)
    instead of running. Where triton is not installed, a no-op."""
    try:
        from triton.runtime import _async_compile
        from triton.runtime.jit import JITFunction
    except ImportError:
        yield
        return
    launch = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        return launch(self, *args, grid=grid, warmup=True, **kwargs)

    pool = ThreadPoolExecutor(workers or min(16, os.cpu_count() or 1),
                              thread_name_prefix="triton-compile")
    JITFunction.run = compile_only
    try:
        with _async_compile.AsyncCompileMode(pool):
            yield
    finally:
        JITFunction.run = launch
        pool.shutdown()
