"""The threads that tokenize: work that grows with a request's size (encoding a prompt,
rendering a chat template, decoding a list of ids) runs here rather than on the event loop, so
a long prompt delays only its own request. The tokenizer lets go of the GIL while it encodes
(`Tokenizer.encode`), so the loop goes on answering other requests meanwhile."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# Enough for a few long prompts at once; more would only queue on the GIL-holding parts.
MAX_THREADS = 4


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

    def close(self) -> None:
        """Drop queued work; a call already running finishes on its thread."""
        self._pool.shutdown(wait=False, cancel_futures=True)
