"""Compiling, in parallel and before they run, the kernels of the forwards that start-up runs
(the memory profile, each CUDA graph's warm-up, the eager warm-up steps): each calls
`compile_ahead(model, batches)` first. Only where the model offers `compile_ahead` (a context
manager factory, e.g. `openinfer_kernels.compile_ahead.compile_ahead`) and
OPENINFER_COMPILE_AHEAD=1 (being measured on the GPU, issue 13)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable

import torch

from openinfer_core.interfaces.model import ForwardBatch, Model

log = logging.getLogger("openinfer")

_WANTED = os.environ.get("OPENINFER_COMPILE_AHEAD", "0") == "1"


def compile_ahead(model: Model, batches: Iterable[ForwardBatch], what: str) -> None:
    """Run `model.forward` over `batches` with the model's kernels compiling instead of
    launching; the outputs are thrown away."""
    factory = getattr(model, "compile_ahead", None)
    if factory is None or not _WANTED or model.device.type != "cuda":
        return
    started = time.perf_counter()
    count = 0
    with torch.inference_mode(), factory():
        for batch in batches:
            model.forward(batch)
            count += 1
    torch.cuda.synchronize(model.device)
    log.info("compiled ahead the kernels of %d %s forwards in %.2f s", count, what,
             time.perf_counter() - started)
