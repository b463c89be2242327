"""Sending a benchmark's requests from several processes. One Python process reading SSE
streams with httpx tops out near 7,000 tokens/s (its event loop is then at 100% of a core,
seen on the dev machine against a server that was idle at 13%), which a fast server outruns:
the client, not the server, would set the figures. Each worker process gets every K-th request
with its arrival time and 1/K of the concurrency, and all start on one wall-clock instant."""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openinfer_server.bench.serve_client import RequestOutcome

START_DELAY_S = 3.0  # time for the workers to start before the first request is due
CONCURRENCY_PER_PROCESS = 64


def client_processes(args: argparse.Namespace, num_prompts: int) -> int:
    """`--client-processes`, or (0) one per CONCURRENCY_PER_PROCESS requests in flight, within
    half the CPUs. (A cap of 8 held 1,024 streams at 128 a process: the busiest at 70 % of a
    core, their requests waiting ~0.27 s to reach the server, 29,157 tok/s from a DP2 server
    that 16 processes, the busiest at 44 %, saw give 34,576: `gpu_check.sh dp` with
    DP_CLIENTS="8 16", 2 x H200.)"""
    if args.client_processes:
        return int(args.client_processes)
    in_flight = args.max_concurrency or num_prompts
    cpus = max(1, (os.cpu_count() or 2) // 2)
    return max(1, min(cpus, math.ceil(in_flight / CONCURRENCY_PER_PROCESS)))


class ClientPool:
    def __init__(self, workers: int, headers: dict[str, str]) -> None:
        self.workers = workers
        self._headers = headers
        self._executor = ProcessPoolExecutor(workers,
                                             mp_context=multiprocessing.get_context("spawn"))

    async def run(self, url: str, payloads: Sequence[dict[str, Any]],
                  offsets: Sequence[float], max_concurrency: int | None,
                  ) -> tuple[list[RequestOutcome], float]:
        """Every payload at its offset from a common start; (outcomes in payload order,
        seconds from the start until the last request ended)."""
        k = self.workers
        share = None if max_concurrency is None else math.ceil(max_concurrency / k)
        start = time.time() + START_DELAY_S
        loop = asyncio.get_running_loop()
        parts = [list(range(w, len(payloads), k)) for w in range(k)]
        futures = [loop.run_in_executor(
            self._executor, _work, self._headers, url, [payloads[i] for i in part],
            [offsets[i] for i in part], share, start) for part in parts if part]
        results = await asyncio.gather(*futures)
        outcomes: list[RequestOutcome | None] = [None] * len(payloads)
        ends = []
        for part, (got, end) in zip([p for p in parts if p], results, strict=True):
            ends.append(end)
            for i, outcome in zip(part, got, strict=True):
                outcomes[i] = outcome
        assert all(o is not None for o in outcomes)
        return [o for o in outcomes if o is not None], max(ends) - start

    def close(self) -> None:
        self._executor.shutdown(cancel_futures=True)


def _work(headers: dict[str, str], url: str, payloads: list[dict[str, Any]],
          offsets: list[float], max_concurrency: int | None,
          start_wall: float) -> tuple[list[RequestOutcome], float]:
    """In a worker process: send the share; (outcomes, wall-clock end)."""
    from openinfer_server.bench.serve_client import make_client, send_on_schedule

    async def go() -> list[RequestOutcome]:
        async with make_client(headers, max_concurrency) as client:
            start = time.perf_counter() + (start_wall - time.time())
            return await send_on_schedule(client, url, payloads, offsets, max_concurrency,
                                          start)

    outcomes = asyncio.run(go())
    return outcomes, time.time()
