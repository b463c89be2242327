"""Device <-> host block copies for the host tier.

On CUDA every transfer runs on the tier's own stream, after the work already queued on the
compute stream (so a save sees the KV the step just wrote, and a load never races a step still
writing a block that was freed meanwhile), in chunks through a device staging buffer: one
gather kernel then one DMA per run of consecutive host slots out, one DMA per run then one
scatter kernel in. An event marks the end; nothing on the engine thread waits for it. On CPU
the copies happen at once."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from openinfer_core.interfaces.offload import OFFLOAD_DEVICE_BYTES
from openinfer_offload.block_copy import gather_blocks, scatter_blocks

STAGING_BYTES = OFFLOAD_DEVICE_BYTES // 2  # device staging, the most a chunk moves at once


def runs(slots: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """`(i, j, first)`: slots[i:j] are first, first + 1, ..."""
    i = 0
    while i < len(slots):
        j = i + 1
        while j < len(slots) and slots[j] == slots[j - 1] + 1:
            j += 1
        yield i, j, slots[i]
        i = j


class DeviceCopier:
    def __init__(self, tensors: Sequence[torch.Tensor], pool: torch.Tensor) -> None:
        self.tensors = list(tensors)
        self.pool = pool  # [slots, block_bytes] uint8, pinned on CUDA machines
        self.device = self.tensors[0].device
        self.stream: torch.cuda.Stream | None = None
        if self.device.type == "cuda":
            self.stream = torch.cuda.Stream(self.device)
            rows = max(1, STAGING_BYTES // pool.shape[1])
            self.staging = torch.empty((rows, pool.shape[1]), dtype=torch.uint8,
                                       device=self.device)

    def to_host(self, block_ids: Sequence[int], slots: Sequence[int]) -> torch.cuda.Event | None:
        """Device blocks -> host slots. Returns the event that marks the end (None: done)."""
        if self.stream is None:
            ids = torch.tensor(block_ids, dtype=torch.int64)
            rows = torch.empty((len(ids), self.pool.shape[1]), dtype=torch.uint8)
            gather_blocks(self.tensors, ids, rows)
            self.pool[torch.tensor(slots, dtype=torch.int64)] = rows
            return None
        return self._on_stream(block_ids, slots, to_host=True)

    def to_device(self, slots: Sequence[int], block_ids: Sequence[int]) -> torch.cuda.Event | None:
        """Host slots -> device blocks. Returns the event that marks the end (None: done)."""
        if self.stream is None:
            rows = self.pool[torch.tensor(slots, dtype=torch.int64)]
            scatter_blocks(rows, torch.tensor(block_ids, dtype=torch.int64), self.tensors)
            return None
        return self._on_stream(block_ids, slots, to_host=False)

    def _on_stream(self, block_ids: Sequence[int], slots: Sequence[int],
                   to_host: bool) -> torch.cuda.Event:
        assert self.stream is not None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        step = self.staging.shape[0]
        with torch.cuda.stream(self.stream):
            all_ids = torch.tensor(block_ids, dtype=torch.int64).to(self.device,
                                                                    non_blocking=True)
            for start in range(0, len(slots), step):
                chunk = slots[start:start + step]
                ids = all_ids[start:start + len(chunk)]
                if to_host:
                    gather_blocks(self.tensors, ids, self.staging)
                for i, j, first in runs(chunk):
                    host = self.pool[first:first + j - i]
                    if to_host:
                        host.copy_(self.staging[i:j], non_blocking=True)
                    else:
                        self.staging[i:j].copy_(host, non_blocking=True)
                if not to_host:
                    scatter_blocks(self.staging, ids, self.tensors)
            event = torch.cuda.Event()
            event.record(self.stream)
        return event

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()
