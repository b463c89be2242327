"""Per-row sampling parameters on their way to the device: staged on the host, sent in one copy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch


class _Views(NamedTuple):
    """Slices of the kept buffers for one batch size n."""

    host: torch.Tensor  # int64 [2n]: n seeds, then 2n fp32 (temperatures, then min_p)
    device: torch.Tensor  # int64 [2n]
    temperature: torch.Tensor  # fp32 [n] on the device
    min_p: torch.Tensor  # fp32 [n] on the device
    seeds: torch.Tensor  # int64 [n] on the device


class RowParamUpload:
    """Writes temperature, min_p and seed of every row into one host buffer (pinned for a CUDA
    device) and sends it with one non-blocking copy into a device buffer.

    The device buffer is kept and reused by the next call, so the tensors returned are valid
    until then: the next step's copy into it is ordered after this step's kernels on the
    stream. The pinned host side is taken fresh from torch's caching host allocator each call,
    because with overlapped steps the next call comes before this copy has run, and the
    allocator does not hand a block out again until the copy that read it has."""

    def __init__(self) -> None:
        self._host = torch.empty(0, dtype=torch.int64)
        self._device_buf: torch.Tensor | None = None
        self._views: dict[int, _Views] = {}  # by batch size: slicing costs host time too

    def upload(self, temperature: Sequence[float], min_p: Sequence[float], seeds: Sequence[int],
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(temperature [n] fp32, min_p [n] fp32, seeds [n] int64) on `device`, a tensor's
        device."""
        n = len(seeds)
        views = self._views.get(n)
        if views is None or views.device.device != device:
            views = self._carve(n, device)
        host = views.host
        if device.type == "cuda":
            host = torch.empty_like(host, pin_memory=True)
        host_np = host.numpy()
        host_np[:n] = seeds
        floats = host_np[n:].view(np.float32)
        floats[:n] = temperature
        floats[n:] = min_p
        views.device.copy_(host, non_blocking=True)
        return views.temperature, views.min_p, views.seeds

    def _carve(self, n: int, device: torch.device) -> _Views:
        buf = self._device_buf
        if buf is None or buf.device != device or buf.numel() < 2 * n:
            grow = buf is not None and buf.device == device
            size = max(2 * n, 2 * buf.numel() if grow and buf is not None else 256)
            self._host = torch.empty(size, dtype=torch.int64)
            self._device_buf = buf = torch.empty(size, dtype=torch.int64, device=device)
            self._views.clear()
        # One int64 buffer: n seeds, then 2n fp32 values in the next n slots.
        dev = buf[:2 * n]
        dev_floats = dev[n:].view(torch.float32)
        views = _Views(self._host[:2 * n], dev, dev_floats[:n], dev_floats[n:], dev[:n])
        self._views[n] = views
        return views
