"""What one start measured that the next start of the same setup can skip: the peak activation
bytes of the memory-profiling forward (memory_budget.py), which otherwise costs every start a
forward of `max_num_batched_tokens` tokens.

An entry is one small JSON file named by a hash of its key and holding the key itself, so a
collision or a hand-edited file is caught by comparing keys. The key is everything the peak
depends on that may change between starts: the model's config.json and the source of its
forward, the step limits, dtype, device name and memory, torch's version and the OPENINFER_*
kernel switches. Readers add `CACHED_MARGIN` on top, so a value from a slightly different
run cannot starve the step of memory; the warm-up's eager forwards of the largest steps check
it again (bring_up.py drops the entry when they run out of memory).

Folder: $OPENINFER_STARTUP_CACHE_DIR, else `startup/` in $OPENINFER_CACHE_DIR (default
~/.cache/openinfer). OPENINFER_STARTUP_CACHE=0 turns reading and writing off."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from openinfer_core.cache_root import cache_root

log = logging.getLogger("openinfer")

SCHEMA = 1
CACHE_ENV = "OPENINFER_STARTUP_CACHE"
DIR_ENV = "OPENINFER_STARTUP_CACHE_DIR"
# Measured peaks vary by a few MiB between runs (allocator rounding, cuBLAS workspaces).
CACHED_MARGIN_FRACTION = 0.10
CACHED_MARGIN_BYTES = 128 << 20
# OPENINFER_* variables that name places or start-up switches, not what a forward runs.
_NOT_KERNEL_ENV = ("_DIR", "OPENINFER_STARTUP_CACHE", "OPENINFER_COMPILE_AHEAD",
                   "OPENINFER_GPU_RESULTS", "OPENINFER_CUDA_GRAPHS_AT_START")


def enabled() -> bool:
    return os.environ.get(CACHE_ENV, "1") != "0"


def cache_dir() -> Path:
    """Where entries live (not created here)."""
    explicit = os.environ.get(DIR_ENV)
    if explicit:
        return Path(explicit)
    return cache_root() / "startup"


def kernel_env() -> dict[str, str]:
    """The OPENINFER_* switches that may change which kernels a forward runs."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith("OPENINFER_") and not any(s in k for s in _NOT_KERNEL_ENV)}


def source_digest(obj: object) -> str:
    """sha256 of the source file that defines `obj`'s class ('' when there is none)."""
    module = sys.modules.get(type(obj).__module__)
    path = getattr(module, "__file__", None)
    if not path:
        return ""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def _path(kind: str, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    return cache_dir() / f"{kind}-{digest[:32]}.json"


def _canonical(key: dict[str, Any]) -> Any:
    """The key as it reads back from JSON (tuples become lists, and so on)."""
    return json.loads(json.dumps(key, sort_keys=True, default=str))


def load(kind: str, key: dict[str, Any]) -> int | None:
    """The stored value for `key`, or None: missing, unreadable, another schema, another key
    (a hash collision or an edited file), or not a positive int."""
    if not enabled():
        return None
    path = _path(kind, key)
    try:
        entry = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("start-up cache: ignoring %s (%s)", path, exc)
        return None
    value = entry.get("value") if isinstance(entry, dict) else None
    if (entry.get("schema") != SCHEMA or entry.get("key") != _canonical(key)
            or isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        log.warning("start-up cache: ignoring %s (another key or a bad value)", path)
        return None
    return value


def store(kind: str, key: dict[str, Any], value: int) -> None:
    """Write the entry atomically (a reader never sees half a file); failures only log."""
    if not enabled():
        return
    path = _path(kind, key)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"schema": SCHEMA, "key": key, "value": int(value)},
                                  sort_keys=True, default=str))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("start-up cache: could not write %s (%s)", path, exc)
        tmp.unlink(missing_ok=True)


def drop(kind: str, key: dict[str, Any]) -> None:
    """Forget the entry (it proved wrong)."""
    _path(kind, key).unlink(missing_ok=True)


def with_margin(value: int) -> int:
    """What a reader budgets for a cached peak of `value` bytes."""
    return int(value * (1 + CACHED_MARGIN_FRACTION)) + CACHED_MARGIN_BYTES
