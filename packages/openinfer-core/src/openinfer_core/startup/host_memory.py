"""Giving host memory back once the engine is built. Loading leaves garbage behind: the
weights' host copies and the read buffers of the checkpoint's shards are freed, but glibc keeps
freed heap pages (and whole arenas, one per thread that allocated) mapped, so the engine
process's resident memory stays at its loading peak; and torch's pinned-memory cache keeps
every pinned buffer freed since (the shard reader's read buffers among them). A collection,
emptying the pinned cache, then `malloc_trim(0)` return those pages to the system; nothing
live is touched."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import sys

log = logging.getLogger("openinfer")


def resident_bytes() -> int | None:
    """This process's resident set size (Linux's /proc; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def resident_mb() -> float:
    """`resident_bytes` in MB (NaN where unknown), for the start-up log."""
    rss = resident_bytes()
    return float("nan") if rss is None else rss / 2**20


def release_host_memory() -> None:
    """Collect garbage and hand freed heap pages back to the system (glibc only; elsewhere
    just the collection). Logs what it gave back."""
    before = resident_bytes()
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        empty_host_cache = getattr(torch._C, "_host_emptyCache", None)
        if empty_host_cache is not None:
            empty_host_cache()
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library this process runs on
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    after = resident_bytes()
    if before is not None and after is not None:
        log.info("host memory: %.0f MB resident after start (%.0f MB given back)",
                 after / 2**20, (before - after) / 2**20)
