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
    cache), by name and `specialization`. False where Triton (or its hook) is missing: nothing
    is watched."""
    try:
        from triton import knobs
    except ImportError:
        return False

    def compiled(*args: Any, **kwargs: Any) -> bool:
        name = str(kwargs.get("repr", "?")).split("[")[0].split("(")[0]
        log.info("kernel compiled after start-up: %s(%s) (the step that launched it waited on "
                 "the JIT)", name, specialization(kwargs.get("compile") or {}))
        return False

    knobs.runtime.jit_post_compile_hook = compiled
    return True


def specialization(compile: dict[str, Any]) -> str:
    """A compile's arguments as Triton specialized them (the hook's `compile`: signature,
    constants, configs): each constexpr and each integer specialized to 1 by its value, each
    other integer `:16n` (a multiple of 16) or `:n`; pointers and floats left out. What a
    warm-up step must reproduce; empty where the hook's layout is not this."""
    try:
        constants = compile.get("constants") or {}
        attrs = (compile.get("configs") or [{}])[0] or {}
        parts = []
        for i, (arg, kind) in enumerate((compile.get("signature") or {}).items()):
            if kind == "constexpr":
                parts.append(f"{arg}={constants.get((i,), '?')}")
            elif isinstance(kind, str) and kind[:1] in "iu":
                aligned = any(a and a[0] == "tt.divisibility" for a in attrs.get((i,), []))
                parts.append(f"{arg}:{'16n' if aligned else 'n'}")
        return ", ".join(parts)
    except (AttributeError, TypeError, ValueError, IndexError):
        return ""
