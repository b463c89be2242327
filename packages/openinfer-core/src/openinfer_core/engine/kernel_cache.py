"""What Triton's on-disk kernel cache holds for this install, known before torch is imported,
and the compile workers started early when it holds nothing yet.

A start that compiles ahead and finishes leaves a marker for the kernels' sources and Triton's
version (besides `compile_ahead`'s per-setup stamp). The engine process checks for it first
thing: where there is none and a GPU is present, this start will compile, so it starts
openinfer-kernels' compile worker processes (`openinfer_kernels.compile_ahead.start_workers`)
before importing torch, and their imports overlap the engine's. Kept free of torch imports."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

log = logging.getLogger("openinfer")

MARKERS = "openinfer-kernels-compiled"  # the markers' folder inside Triton's cache folder
MODE_ENV = "OPENINFER_COMPILE_AHEAD"  # compile_ahead's: 0 starts no workers either


def triton_cache_dir() -> Path:
    """Triton's on-disk kernel cache ($TRITON_CACHE_DIR, default ~/.triton/cache)."""
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def kernel_sources_digest(package: str = "openinfer_kernels") -> str:
    """A digest of the names, sizes and modification times of `package`'s .py files: it
    changes when a kernel's source does ('' when the package is not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return ""
    digest = hashlib.sha256()
    for root in spec.submodule_search_locations:
        for path in sorted(Path(root).rglob("*.py")):
            stat = path.stat()
            digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _marker() -> Path:
    try:
        triton = version("triton")
    except PackageNotFoundError:
        triton = ""
    name = hashlib.sha256(f"{kernel_sources_digest()}:{triton}".encode()).hexdigest()[:32]
    return triton_cache_dir() / MARKERS / name


def mark_kernels_compiled() -> None:
    marker = _marker()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()


def start_compile_workers(device: str) -> bool:
    """Start the compile workers where this start will likely compile kernels: compile-ahead
    not off, a CUDA device asked for (or "auto" with an NVIDIA driver present), openinfer-kernels
    installed, and no marker for its sources yet. Whether it started them."""
    if os.environ.get(MODE_ENV, "auto") == "0":
        return False
    if not (device.startswith("cuda") or (device == "auto" and Path("/dev/nvidiactl").exists())):
        return False
    if importlib.util.find_spec("openinfer_kernels") is None or _marker().exists():
        return False
    from openinfer_kernels.compile_ahead import start_workers

    start_workers()
    return True


def stop_compile_workers() -> None:
    """End the compile workers, if any were started (start-up is over)."""
    if importlib.util.find_spec("openinfer_kernels") is None:
        return
    from openinfer_kernels.compile_ahead import stop_workers

    stop_workers()
