"""Ranks of a collective kernel as processes on one machine without GPUs: the tests map the
ranks' memory (landing areas, flags, signal pads) as CPU shared memory at the same address in
each process (fork), so under the Triton interpreter their programs really meet."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any


def run_ranks_forked(world: int, run_rank: Callable[..., None], *args: Any) -> list[int | None]:
    """run_rank(rank, *args) for ranks 1.. in forked processes and rank 0 in this one (so the
    TTIR sweep sees its launches), then the forked ranks' exit codes (None: killed after 60 s
    waiting)."""
    context = multiprocessing.get_context("fork")
    peers = [context.Process(target=run_rank, args=(rank, *args), daemon=True)
             for rank in range(1, world)]
    for process in peers:
        process.start()
    try:
        run_rank(0, *args)
        for process in peers:
            process.join(60)
    finally:
        for process in peers:
            if process.is_alive():
                process.kill()
    return [process.exitcode for process in peers]
