"""`sm_count`: a device's streaming multiprocessors, which launchers size their grids by."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache
def sm_count(device: torch.device, interpreter: int = 4) -> int:
    """The SM count of a CUDA device, cached (the property query costs host time at every
    launch). Any other device means the interpreter, which runs one program at a time: it gets
    `interpreter`, the count the caller's grid logic should see there (a few SMs keep split
    and merge paths in play under the CPU tests)."""
    if device.type != "cuda":
        return interpreter
    return torch.cuda.get_device_properties(device).multi_processor_count
