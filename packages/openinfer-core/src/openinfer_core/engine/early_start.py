"""Start-up work the engine process begins before it needs it, so that it overlaps the
seconds spent importing torch, the kernels and the model line:

- `prefetch_checkpoint`: ask the kernel to read the checkpoint's shards into the page cache
  (readahead, `posix_fadvise(WILLNEED)`), so loading finds them there rather than on disk.
- `start_device`: create the CUDA context in a helper thread. Torch's Python bindings release
  the GIL inside an op, so the context's creation (driver init, device memory setup) runs
  while the main thread goes on importing; the first device use in the main thread waits for
  it through torch's own initialization lock."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

log = logging.getLogger("openinfer")


def prefetch_checkpoint(folder: str | Path, load_format: str) -> threading.Thread | None:
    """Readahead of `folder`'s *.safetensors in a daemon thread (none for dummy weights or
    where posix_fadvise is missing)."""
    if load_format == "dummy" or not hasattr(os, "posix_fadvise"):
        return None
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None

    def advise() -> None:
        for path in files:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(fd)

    thread = threading.Thread(target=advise, name="openinfer-prefetch", daemon=True)
    thread.start()
    return thread


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
