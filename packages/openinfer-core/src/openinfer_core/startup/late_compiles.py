"""Kernels compiled after start-up, in the log: start-up compiles ahead and warms up every step
shape it knows of, so that no step of a running engine waits on the JIT (about a second a
Triton kernel). A kernel that still compiles later (a step shape the warm-up missed) delays the
requests of that step; the log then names it, so the warm-up can learn it."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("openinfer")


def log_late_compiles() -> bool:
    """From now on, log each Triton kernel this process compiles (or loads from Triton's disk
    cache), by name and specialization. False where Triton (or its hook) is missing: nothing
    is watched."""
    try:
        from triton import knobs
    except ImportError:
        return False

    def compiled(*args: Any, **kwargs: Any) -> bool:
        # Triton's whole `name[options](arg: specialization, ...)`: the integers' classes
        # (1, divisible by 16, neither) say which step shape the warm-up missed.
        log.info("kernel compiled after start-up: %s (the step that launched it waited on "
                 "the JIT)", kwargs.get("repr", "?"))
        return False

    knobs.runtime.jit_post_compile_hook = compiled
    return True

