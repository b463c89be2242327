# mypy: disable-error-code="no-untyped-def"
"""Programmatic dependent launch (Hopper and later): a kernel launched with it may be scheduled
while the kernel before it in the stream still drains, so its launch and the previous kernel's
tail overlap (in CUDA graphs too). Each such kernel calls `pdl_enter`: it waits there until
the previous kernel has finished and its writes are visible, then lets the next kernel be
scheduled. Before that call a kernel writes nothing and reads nothing the kernel just before
it writes. It may read what older kernels or the host wrote (weights, the step's inputs, the
KV cache of earlier steps), which hides those reads behind the previous kernel: a kernel is
scheduled only once the one before has passed its own `pdl_enter`, so the kernel two back has
finished by then (a kernel launched without PDL lets the next one start when it ends). On by
default where the GPU has it (compute capability 9.0 and later); OPENINFER_PDL=0 turns it off.
Elsewhere `pdl_enter` compiles to nothing.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_WANTED = os.environ.get("OPENINFER_PDL", "1") != "0"


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@functools.lru_cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_launch(t: torch.Tensor) -> dict[str, bool]:
    """The keywords for launching a kernel that calls `pdl_enter`, for work on `t`'s device."""
    if _WANTED and t.is_cuda and _capable(t.device.index if t.device.index is not None
                                          else torch.cuda.current_device()):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}
