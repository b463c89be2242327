"""Ranks of a collective kernel as processes on one machine without GPUs: the tests map the
ranks' memory (landing areas, flags, signal pads; `push_memory` makes the push kernels') as
CPU shared memory at the same address in each process (fork), so under the Triton interpreter
their programs really meet."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import torch


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


def push_memory(world: int, hidden: int, dtype: torch.dtype, *, shared: bool,
                device: str = "cpu", fill: int = 0xFF
                ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Every rank's landing area, flags and call counts as the push kernels
    (`collective/push_triton.py`) want them before their first call: areas of `fill` bytes
    (0xFF, `EMPTY_BYTE`: the rows as their own signal; 0 with flags), flags and counts zeros;
    `shared`: in CPU shared memory, for ranks forked after."""
    from openinfer_kernels.collective.push_triton import area_elements, flag_slots
    from openinfer_kernels.collective.triton import MAX_PROGRAMS

    def made(n: int, kind: torch.dtype) -> torch.Tensor:
        t = torch.zeros(n, dtype=kind, device=device)
        return t.share_memory_() if shared else t

    areas = [made(area_elements(world, hidden), dtype) for _ in range(world)]
    for area in areas:
        area.view(torch.uint8).fill_(fill)
    flags = [made(flag_slots(world), torch.int32) for _ in range(world)]
    return areas, flags, [made(MAX_PROGRAMS, torch.int32) for _ in range(world)]
