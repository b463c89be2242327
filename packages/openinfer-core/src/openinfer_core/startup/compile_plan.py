"""Whether this start compiles its kernels ahead (compile_round.py does it), and the stamp a
start that did leaves behind.

Only where the model declares `compile_ahead_safe` (`capabilities.SupportsCompileAhead`), a plugin
registered a kernel compiler and the device is CUDA. OPENINFER_COMPILE_AHEAD: 1 always, 0
never, auto (default) only on a cold start. A compile-ahead pass runs each forward twice (once
compiling, its torch ops for real, then for real), which a warm start, whose kernels are all in
the compiler's cache, only pays for (`benchmarks/device/startup.py`: warm starts with
OPENINFER_COMPILE_AHEAD=1 against auto). So a start that compiled ahead and finished leaves a
stamp for its setup (model, limits, device, kernel sources, compiler versions) in the compilers'
caches, and "auto" skips the pass where the stamp is. Emptying the cache empties the stamps with
it; a stale stamp (kernels changed) costs one start compiling kernels one after the other, as
without compile-ahead, never a wrong result."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openinfer_core.interfaces.capabilities import supports_compile_ahead
from openinfer_core.interfaces.model import Model
from openinfer_core.startup.kernel_compilers import MODE_ENV, KernelCompilers

log = logging.getLogger("openinfer")

STAMPS = "openinfer-compiled"  # the stamps' folder inside each compiler's cache


@dataclass(slots=True)
class CompilePlan:
    """This start's choice: it compiles ahead while it has stamps to write (until `finish`);
    what compiles after start does so on use."""

    compilers: KernelCompilers
    stamps: list[Path] = field(default_factory=list)  # to write when start-up finishes

    @property
    def active(self) -> bool:
        return bool(self.stamps)

    def finish(self) -> None:
        """Start-up finished: stop the compile workers; where it compiled ahead, every
        kernel it ran is in the compilers' caches, so stamp this setup (later starts of it
        need not compile ahead) and this install's kernels (the workers need not start
        early)."""
        self.compilers.stop_workers()
        if not self.active:
            return
        try:
            for stamp in self.stamps:
                stamp.parent.mkdir(parents=True, exist_ok=True)
                stamp.touch()
            self.compilers.mark_compiled()
        except OSError as exc:
            log.warning("compile ahead: could not write %s (%s)", self.stamps, exc)
        self.stamps = []


def plan_compile(model: Model, key: dict[str, Any], compilers: KernelCompilers) -> CompilePlan:
    """Decide, for this start of `model` (set up as `key` says), whether start-up compiles
    ahead."""
    mode = os.environ.get(MODE_ENV, "auto")
    if not supports_compile_ahead(model) or not compilers or model.device.type != "cuda":
        return CompilePlan(compilers)
    text = json.dumps({**key, "compilers": compilers.fingerprint()}, sort_keys=True, default=str)
    stamps = compilers.marks(STAMPS, hashlib.sha256(text.encode()).hexdigest()[:32])
    active = mode == "1" or (mode == "auto" and not all(s.exists() for s in stamps))
    log.info("compile ahead: %s (%s=%s)", "on" if active else
             "off, this setup's kernels were compiled by an earlier start", MODE_ENV, mode)
    return CompilePlan(compilers, stamps if active else [])
