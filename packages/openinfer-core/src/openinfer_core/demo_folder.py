"""Demo checkpoints (a model line's `demo=` target, served when `openinfer serve` gets no
MODEL): written once under the openinfer cache and found there after. Finding one imports no
torch, so the API process never loads it; writing one does, in a child process when the
caller has not imported torch itself."""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import shutil
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from openinfer_core.cache_root import cache_root

log = logging.getLogger("openinfer.demo")


def version_key(*parts: bytes | str) -> str:
    """A short digest of what makes a demo (its writer's source, its settings): a change to
    any of them makes a new folder instead of serving a stale one."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def cached_demo(name: str, key: str, write: Callable[[Path], object]) -> Path:
    """The folder `<cache>/<name>-<key>`, made by `write(tmp)` (a module-level function: it
    may run in a spawned child) and renamed into place on first use; concurrent first uses
    each write, and the first rename wins."""
    root = cache_root()
    final = root / f"{name}-{key}"
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    log.info("writing the demo checkpoint to %s (first use)", final)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}-"))
    try:
        if "torch" in sys.modules:
            write(tmp)
        else:  # the API process: the weights are made in a child, so torch stays out of it
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(1, mp_context=context) as pool:
                pool.submit(write, tmp).result()
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is readable like any other
        try:
            tmp.rename(final)
        except OSError:
            if not final.is_dir():  # not a concurrent writer finishing first: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
