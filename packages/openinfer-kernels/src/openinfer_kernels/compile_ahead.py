"""Compiling Triton kernels ahead, in parallel. Triton compiles a kernel variant the first time
it is launched (about 0.3-1 s each on the H100's host), so a cold start that captures a few
dozen CUDA graphs waits on some twenty-five compilations, one after the other. Within
`compile_ahead()` a launch only has its variant compiled and launches nothing; leaving it waits
for every compilation, so the real launches that follow find them compiled.

Where: in worker processes when `start_workers` started them, else in a thread pool (Triton's
own `AsyncCompileMode`). Threads share one GIL, and most of a compilation holds it (the
front end is Python, the MLIR passes are bound without releasing it): on the H100's host 16
threads took 7-8 s for 26 variants, barely better than one. A worker process compiles a
variant from what Triton's launch computed (signature, constexprs, attributes, options,
target) into Triton's cache on disk, where this process's launch then finds it; the workers
import torch and Triton while the engine imports its own, so they are ready when the weights
are. A kernel the workers cannot import by name (one defined inside a function) compiles
here.

Torch ops run as usual inside (over whatever the skipped kernels left in their outputs): a
forward run there must not act on its results.

`TritonCompiler` offers this to start-up as an
`openinfer_core.interfaces.kernel_compiler.KernelCompiler` (registered in plugin.py). Importing
this module imports neither torch nor Triton: the engine process uses it before it imports
them."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import AbstractContextManager
from importlib import metadata
from pathlib import Path
from typing import Any

log = logging.getLogger("openinfer")

_workers: dict[str, Any] = {"pool": None, "ready": []}


def start_workers(count: int | None = None) -> None:
    """Start `count` compile worker processes (default one per core but one, at most 16) and
    have them import torch and Triton now. Idempotent; `stop_workers` ends them."""
    if _workers["pool"] is not None:
        return
    import multiprocessing

    count = count or max(1, min(16, (os.cpu_count() or 2) - 1))
    pool = ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_import_compiler)
    # Every worker starts now (they are spawned on demand); each says when it was ready.
    _workers["ready"] = [pool.submit(time.time) for _ in range(count)]
    _workers["pool"] = pool
    log.info("compile ahead: %d worker processes starting", count)


def stop_workers() -> None:
    pool = _workers["pool"]
    if pool is not None:
        _workers["pool"] = None
        pool.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def compile_ahead(workers: int | None = None) -> Iterator[None]:
    """Within: Triton launches compile (in the worker processes if started, else in
    `workers` threads, default one per core up to 16) instead of running. Where triton is not
    installed, a no-op."""
    try:
        from triton.runtime import _async_compile
        from triton.runtime.jit import JITFunction
    except ImportError:
        yield
        return
    launch = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        return launch(self, *args, grid=grid, warmup=True, **kwargs)

    JITFunction.run = compile_only
    try:
        if _workers["pool"] is not None:
            with _in_workers(JITFunction):
                yield
        else:
            pool = ThreadPoolExecutor(workers or min(16, os.cpu_count() or 1),
                                      thread_name_prefix="triton-compile")
            try:
                with _async_compile.AsyncCompileMode(pool):
                    yield
            finally:
                pool.shutdown()
    finally:
        JITFunction.run = launch


class TritonCompiler:
    """Triton's compile-ahead for start-up: this module's worker pool (one per process,
    whatever the instance) and `compile_ahead`, compiling into Triton's on-disk cache."""

    def cache_dir(self) -> Path:
        """Triton's on-disk kernel cache ($TRITON_CACHE_DIR, default ~/.triton/cache)."""
        return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")

    def version(self) -> str:
        try:
            return metadata.version("triton")
        except metadata.PackageNotFoundError:
            return ""

    def start_workers(self) -> None:
        start_workers()

    def stop_workers(self) -> None:
        stop_workers()

    def compiling(self) -> AbstractContextManager[None]:
        return compile_ahead()


@contextlib.contextmanager
def _in_workers(jit_function: Any) -> Iterator[None]:
    """Send each variant a launch would compile to the worker processes, once (this process
    keeps no compiled kernel, so every launch of it asks again); wait for them all on the way
    out."""
    compile_here = jit_function._do_compile
    pool: ProcessPoolExecutor = _workers["pool"]
    jobs: dict[tuple[Any, ...], Future[tuple[float, float]]] = {}
    began = time.time()

    def send(self, key, signature, device, constexprs, options, attrs, warmup):
        name = _importable_name(self)
        if name is None:
            return compile_here(self, key, signature, device, constexprs, options, attrs, warmup)
        if (name, key) not in jobs:
            target = self.device_caches[device][2]
            jobs[name, key] = pool.submit(_compile, name, signature, constexprs, attrs,
                                          options.__dict__, target)
        return None  # compiled, not loaded: the real launch loads it from Triton's cache

    jit_function._do_compile = send
    try:
        yield
    finally:
        jit_function._do_compile = compile_here
        spans: list[tuple[float, float, str]] = []  # (began, ended, kernel)
        for ((_, kernel), _), job in jobs.items():
            try:
                spans.append((*job.result(), kernel))
            except Exception as exc:  # its first launch compiles it instead
                log.warning("compile ahead: a worker could not compile %s: %s", kernel, exc)
        if spans:
            slowest = sorted(spans, key=lambda s: s[0] - s[1])[:4]
            log.info("compile ahead: the slowest variants to compile: %s", ", ".join(
                f"{kernel} {end - start:.2f} s" for start, end, kernel in slowest))
            ready = [f.result() for f in _workers["ready"] if f.done() and not f.exception()]
            log.info("compile ahead: %d variants in worker processes (the last of them ready "
                     "%.2f s after the round began), the first begun %.2f s and the last done "
                     "%.2f s after it, %.1f s of compiling in all", len(spans),
                     max(ready, default=began) - began, min(s[0] for s in spans) - began,
                     max(s[1] for s in spans) - began, sum(s[1] - s[0] for s in spans))


def _importable_name(fn: Any) -> tuple[str, str] | None:
    """(module, name) that a worker imports to find the Triton function `fn` (through the
    `fn` of an autotuner or heuristics wrapper), or None."""
    module, name = fn.fn.__module__, fn.fn.__qualname__
    if "<locals>" in name:
        return None
    try:
        found = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    while found is not fn and hasattr(found, "fn"):
        found = found.fn
    return (module, name) if found is fn else None


def _import_compiler() -> None:
    """A worker's start: what every compilation needs, imported once."""
    import torch  # noqa: F401  (the kernels' modules import it)
    import triton.compiler
    import triton.language  # noqa: F401


def _compile(name: tuple[str, str], signature: dict[str, Any], constexprs: dict[Any, Any],
             attrs: dict[Any, Any], options: dict[str, Any], target: Any) -> tuple[float, float]:
    """In a worker: compile one variant into Triton's cache (what `JITFunction._do_compile`
    compiles, from the same parts); when it began and ended (the clock's seconds)."""
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile
    from triton.runtime.jit import JITFunction

    fn: Any = importlib.import_module(name[0])
    for part in name[1].split("."):
        fn = getattr(fn, part)
    while not isinstance(fn, JITFunction):  # inside an autotuner or heuristics wrapper
        fn = fn.fn
    started = time.time()
    triton_compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options)
    return started, time.time()
