"""Device <-> host block copies for the host tier.

On CUDA every transfer runs on the tier's own stream, after the work already queued on the
compute stream (so a save sees the KV the step just wrote, and a load never races a step still
writing a block that was freed meanwhile), in chunks through two device staging buffers in
turn: one gather kernel then one DMA per run of consecutive host slots out, one DMA per run
then one scatter kernel in, the kernels on a second stream so they overlap the next chunk's
DMA. An event marks the end; nothing on the engine thread waits for it. On CPU the copies
happen at once."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from openinfer_core.interfaces.offload import OFFLOAD_DEVICE_BYTES
from openinfer_offload.block_copy import BlockMover


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
    def __init__(self, tensors: Sequence[torch.Tensor], pool: torch.Tensor,
                 staging_bytes: int = OFFLOAD_DEVICE_BYTES) -> None:
        """`staging_bytes`: the device memory this copier may take; its two staging buffers
        take half of it (a chunk moves at most a quarter)."""
        self.mover = BlockMover(tensors)
        self.pool = pool  # [slots, block_bytes] uint8, pinned on CUDA machines
        self.device = tensors[0].device
        self.stream: torch.cuda.Stream | None = None
        self.kernel_stream: torch.cuda.Stream | None = None
        if self.device.type == "cuda":
            self.stream = torch.cuda.Stream(self.device)
            self.kernel_stream = torch.cuda.Stream(self.device)
            rows = max(1, staging_bytes // 4 // pool.shape[1])
            self.staging = [torch.empty((rows, pool.shape[1]), dtype=torch.uint8,
                                        device=self.device) for _ in range(2)]
            self._free = [_record(self.stream), _record(self.stream)]

    def to_host(self, block_ids: Sequence[int], slots: Sequence[int]) -> torch.cuda.Event | None:
        """Device blocks -> host slots. Returns the event that marks the end (None: done)."""
        if self.stream is None:
            ids = torch.tensor(block_ids, dtype=torch.int64)
            rows = torch.empty((len(ids), self.pool.shape[1]), dtype=torch.uint8)
            self.mover.gather(ids, rows)
            self.pool[torch.tensor(slots, dtype=torch.int64)] = rows
            return None
        return self._on_stream(block_ids, slots, to_host=True)

    def to_device(self, slots: Sequence[int], block_ids: Sequence[int]) -> torch.cuda.Event | None:
        """Host slots -> device blocks. Returns the event that marks the end (None: done)."""
        if self.stream is None:
            rows = self.pool[torch.tensor(slots, dtype=torch.int64)]
            self.mover.scatter(rows, torch.tensor(block_ids, dtype=torch.int64))
            return None
        return self._on_stream(block_ids, slots, to_host=False)

    def _on_stream(self, block_ids: Sequence[int], slots: Sequence[int],
                   to_host: bool) -> torch.cuda.Event:
        """Chunks through the two staging halves: the DMAs run on `stream`, the gathers and
        scatters on `kernel_stream`, so chunk k's kernel overlaps chunk k + 1's DMA."""
        assert self.stream is not None and self.kernel_stream is not None
        compute = torch.cuda.current_stream(self.device)
        dma, kernel = self.stream, self.kernel_stream
        dma.wait_stream(compute)
        kernel.wait_stream(compute)
        step = self.staging[0].shape[0]
        with torch.cuda.stream(kernel):
            all_ids = torch.tensor(block_ids, dtype=torch.int64).to(self.device,
                                                                    non_blocking=True)
        for k, start in enumerate(range(0, len(slots), step)):
            staging = self.staging[k % 2]
            chunk = slots[start:start + step]
            ids = all_ids[start:start + len(chunk)]
            first, then = (kernel, dma) if to_host else (dma, kernel)
            with torch.cuda.stream(first):
                first.wait_event(self._free[k % 2])  # the chunk before last is done with it
                if to_host:
                    self.mover.gather(ids, staging)
                else:
                    self._dma(chunk, staging, to_host)
                then.wait_event(_record(first))
            with torch.cuda.stream(then):
                if to_host:
                    self._dma(chunk, staging, to_host)
                else:
                    self.mover.scatter(staging, ids)
                self._free[k % 2] = _record(then)
        dma.wait_stream(kernel)
        return _record(dma)

    def _dma(self, chunk: Sequence[int], staging: torch.Tensor, to_host: bool) -> None:
        """One copy per run of consecutive slots, on the current stream."""
        for i, j, first in runs(chunk):
            host = self.pool[first:first + j - i]
            if to_host:
                host.copy_(staging[i:j], non_blocking=True)
            else:
                staging[i:j].copy_(host, non_blocking=True)

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()


def _record(stream: torch.cuda.Stream) -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record(stream)
    return event
