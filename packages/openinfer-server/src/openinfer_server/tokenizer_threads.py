"""The threads that tokenize: work that grows with a request's size (encoding a prompt,
rendering a chat template, decoding a list of ids) runs here rather than on the event loop, so
a long prompt delays only its own request. The tokenizer lets go of the GIL while it encodes
(`Tokenizer.encode`), so the loop goes on answering other requests meanwhile.

A small request's work runs on the loop instead (`run_for`): the hop to a worker and back
waits for the GIL each way, up to the interpreter's switch interval (5 ms) while the loop is
busy, so under a burst of requests the hops, not the work, set how fast a frontend takes them
in. Encoding 4 KB of text takes 1.4 ms, and with no hops a 512-request burst at one frontend
took 1.3 ms a request in where it took 14.5 (the Qwen3 tokenizer, the built-in demo, one core
of the dev machine: `benchmarks/frontend_burst.py --encode DIR`, and without it against
`openinfer serve`)."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from starlette.requests import Request

P = ParamSpec("P")
T = TypeVar("T")

# Enough for a few long prompts at once; more would only queue on the GIL-holding parts.
MAX_THREADS = 4
# Request bodies up to this many bytes are tokenized on the loop (`run_for`).
INLINE_MAX_BYTES = 4096


class TokenizerThreads:
    """A small pool of worker threads. `run` may be awaited from any task of the loop; the
    function it is given must not touch the loop. Threads start on first use."""

    def __init__(self, threads: int | None = None) -> None:
        # One core left to the event loop: tokenizing at full tilt must not starve it.
        count = threads or max(1, min(MAX_THREADS, len(os.sched_getaffinity(0)) - 1))
        self._pool = ThreadPoolExecutor(max_workers=count,
                                         thread_name_prefix="openinfer-tokenize")

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` on a worker thread; its exception is raised here."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def run_for(self, request: Request, fn: Callable[P, T], *args: P.args,
                      **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` for `request`: right here if its body is at most
        INLINE_MAX_BYTES (by its Content-Length; none means large), else as `run`."""
        length = request.headers.get("content-length", "")
        if length.isascii() and length.isdigit() and int(length) <= INLINE_MAX_BYTES:
            return fn(*args, **kwargs)
        return await self.run(fn, *args, **kwargs)

    def close(self) -> None:
        """Drop queued work; a call already running finishes on its thread."""
        self._pool.shutdown(wait=False, cancel_futures=True)
