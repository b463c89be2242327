"""Compiling, in parallel and before they run, the kernels of the forwards that start-up runs
(the memory profile, each CUDA graph's warm-up, the eager warm-up steps), all in one round right
after the weights load (`start_kernels.compile_start_kernels` calls `compile_ahead` with every
one of them). Only where the model offers `compile_ahead` (a context manager factory, e.g.
`openinfer_kernels.compile_ahead.compile_ahead`); a variant the round did not foresee compiles
at its first launch.

OPENINFER_COMPILE_AHEAD: 1 always, 0 never, auto (default) only on a cold start. A compile-ahead
pass runs each forward twice (once compiling, its torch ops for real, then for real), which a
warm start, whose kernels are all in Triton's cache, only pays for: that is why turning it on
for every start made warm starts slower (8.3 -> 9.8 s, issue 13). So a start that compiled
ahead and finished leaves a stamp for its setup (model, limits, device, kernel sources) in
Triton's cache folder, and "auto" skips the pass where the stamp is. Emptying the Triton cache
empties the stamps with it; a stale stamp (kernels changed) costs one start compiling kernels
one after the other, as without compile-ahead, never a wrong result.

One engine per process: `plan` sets this process's choice, `mark_compiled` writes the stamp."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from openinfer_core.engine.kernel_cache import (
    MODE_ENV,
    kernel_sources_digest,
    mark_kernels_compiled,
    stop_compile_workers,
    triton_cache_dir,
)
from openinfer_core.interfaces.model import ForwardBatch, Model

log = logging.getLogger("openinfer")

STAMPS = "openinfer-compiled"  # the stamps' folder inside Triton's cache folder

_state: dict[str, Any] = {"active": os.environ.get(MODE_ENV, "auto") == "1", "stamp": None}


def stamp_path(key: dict[str, Any]) -> Path:
    text = json.dumps(key, sort_keys=True, default=str)
    return triton_cache_dir() / STAMPS / hashlib.sha256(text.encode()).hexdigest()[:32]


def plan(model: Model, key: dict[str, Any]) -> bool:
    """Decide, for this start of `model` (set up as `key` says), whether start-up compiles
    ahead; returns the choice."""
    mode = os.environ.get(MODE_ENV, "auto")
    if getattr(model, "compile_ahead", None) is None or model.device.type != "cuda":
        _state.update(active=False, stamp=None)
        return False
    try:
        import triton

        version = triton.__version__
    except ImportError:
        version = ""
    stamp = stamp_path({**key, "triton": version, "kernels": kernel_sources_digest()})
    active = mode == "1" or (mode == "auto" and not stamp.exists())
    _state.update(active=active, stamp=stamp if active else None)
    log.info("compile ahead: %s (%s=%s)", "on" if active else
             "off, this setup's kernels were compiled by an earlier start", MODE_ENV, mode)
    return active


def is_active() -> bool:
    """Whether this start compiles ahead (`plan` said so and start-up has not finished)."""
    return bool(_state["active"])


def mark_compiled() -> None:
    """Start-up finished: every kernel it ran is in Triton's cache; later starts of this
    setup need not compile ahead."""
    stop_compile_workers()
    stamp = _state["stamp"]
    if stamp is None:
        return
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.touch()
        mark_kernels_compiled()
    except OSError as exc:
        log.warning("compile ahead: could not write %s (%s)", stamp, exc)
    _state.update(active=False, stamp=None)  # what compiles after start does so on use


def compile_ahead(model: Model, batches: Iterable[ForwardBatch], what: str,
                  also: Callable[[], object] | None = None) -> None:
    """Run `model.forward` over `batches` (then `also`, when given) with the model's kernels
    compiling instead of launching; the outputs are thrown away."""
    factory = getattr(model, "compile_ahead", None)
    if factory is None or not _state["active"] or model.device.type != "cuda":
        return
    started = time.perf_counter()
    count = 0
    with torch.inference_mode(), factory():
        for batch in batches:
            model.forward(batch)
            count += 1
        if also is not None:
            also()
    torch.cuda.synchronize(model.device)
    log.info("compiled ahead the kernels of %d %s forwards in %.2f s", count, what,
             time.perf_counter() - started)
