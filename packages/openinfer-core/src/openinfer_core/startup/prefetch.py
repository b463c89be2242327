"""Start-up work the engine process begins before it needs it, so that it overlaps the
seconds spent importing torch, the kernels and the model line:

- `prefetch_checkpoint`: read the checkpoint's shards into the page cache in a thread, so
  loading finds them there rather than on the disk.
- `start_device`: create the CUDA context in a helper thread. Torch's Python bindings release
  the GIL inside an op, so the context's creation (driver init, device memory setup) runs
  while the main thread goes on importing; the first device use in the main thread waits for
  it through torch's own initialization lock."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

log = logging.getLogger("openinfer")


PREFETCH_CHUNK = 16 << 20  # bytes a read asks for
PREFETCH_MEMORY_SHARE = 0.5  # of the memory the system has available: the most read ahead


def prefetch_checkpoint(folder: str | Path, load_format: str) -> threading.Thread | None:
    """Read `folder`'s *.safetensors into the page cache in a daemon thread, in the order the
    loader reads them (none for dummy weights or a folder without shards). At most
    `PREFETCH_MEMORY_SHARE` of the available memory is read ahead, so a checkpoint larger than
    memory does not push out its own first shards."""
    if load_format == "dummy":
        return None
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    budget = int(PREFETCH_MEMORY_SHARE * (_available_memory() or 0))
    thread = threading.Thread(target=_read_ahead, args=(files, budget),
                              name="openinfer-prefetch", daemon=True)
    thread.start()
    return thread


def _read_ahead(files: list[Path], budget: int) -> None:
    """Read `files` front to back in large reads into one reused buffer, up to `budget`
    bytes in all. A plain read, not only posix_fadvise(WILLNEED): the hint is dropped on some
    filesystems (overlays), and a read ahead of the loader is what makes its own reads hits.
    The reads release the GIL, so the imports beside them go on."""
    buffer = bytearray(PREFETCH_CHUNK)
    started, done = time.perf_counter(), 0
    for path in files:
        try:
            with open(path, "rb", buffering=0) as f:
                while done < budget and (n := f.readinto(buffer)):
                    done += n
        except OSError as exc:  # the loader meets the same error and reports it
            log.debug("read-ahead of %s stopped: %s", path, exc)
        if done >= budget:
            break
    log.debug("read ahead %.2f GB of the checkpoint in %.2f s", done / 1e9,
              time.perf_counter() - started)


def _available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def start_device(device: str) -> threading.Thread | None:
    """Create `device`'s CUDA context in a daemon thread ("auto": the first GPU if there is
    one); None for the CPU. Imports torch here if the caller has not."""
    if device == "cpu":
        return None
    import torch

    def init() -> None:
        try:
            if device == "auto" and not torch.cuda.is_available():
                return
            torch.empty(1, device="cuda" if device == "auto" else device)
        except Exception as exc:  # the main thread meets the same error and reports it
            log.debug("early CUDA start failed: %s", exc)

    thread = threading.Thread(target=init, name="openinfer-cuda-init", daemon=True)
    thread.start()
    return thread
