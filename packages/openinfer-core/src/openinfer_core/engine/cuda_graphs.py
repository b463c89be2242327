"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket.

A decode step (every row one token) has the same kernels at every step; only the contents of a
few small tensors change. So each bucket's forward is captured once over fixed input buffers, and
a step copies its rows into those buffers and replays the bucket just above its batch size. The
rows past the batch are padding: token 0 at position 0, writing its KV into the padding block 0
and reading one token from it; their logits are never looked at."""

from __future__ import annotations

import logging
import time

import torch

from openinfer_core.engine.batch import HostBatch
from openinfer_core.interfaces.model import ForwardBatch, Model

log = logging.getLogger("openinfer")


def graph_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, 16, then every 16 up to `max_batch` (which is always a bucket)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch]
    sizes += list(range(16, max_batch, 16))
    return [*sizes, max_batch]


class CudaGraphRunner:
    """Owns the fixed input buffers and one captured graph per bucket. Engine thread only."""

    def __init__(self, model: Model, max_batch: int, max_blocks_per_seq: int) -> None:
        self.model = model
        self.device = model.device
        self.buckets = graph_buckets(max_batch)
        n, dev = max_batch, self.device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.zeros(n, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.logits_indices = torch.arange(n, dtype=torch.int64, device=dev)
        # Host staging for the 1-D inputs (ids, positions, slots, seq_lens), pinned so the
        # copy is asynchronous; rewritten only after the previous step's sampled ids came
        # back, so the previous copy has landed.
        self._staging = torch.zeros(4, n, dtype=torch.int64).pin_memory()
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}
        self.capture_seconds = 0.0

    def capture(self) -> None:
        """Warm every bucket up (compiling its kernels), then capture, largest first so the
        smaller graphs reuse the larger ones' memory pool."""
        started = time.perf_counter()
        with torch.inference_mode():
            for b in self.buckets:
                self.model.forward(self._batch(b))
            torch.cuda.synchronize(self.device)
            pool = torch.cuda.graph_pool_handle()
            for b in reversed(self.buckets):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._logits[b] = self.model.forward(self._batch(b))
                self._graphs[b] = graph
            torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - started
        log.info("CUDA graphs: captured %d decode batch sizes (1..%d) in %.2f s",
                 len(self.buckets), self.buckets[-1], self.capture_seconds)

    def can_run(self, batch: HostBatch) -> bool:
        return batch.is_decode and batch.num_seqs <= self.buckets[-1] and bool(self._graphs)

    def run(self, batch: HostBatch) -> torch.Tensor:
        """Copy `batch` into the buffers, replay its bucket; fp32 logits [B, V] (a view of
        the graph's output, valid until the next replay)."""
        b = batch.num_seqs
        bucket = next(s for s in self.buckets if s >= b)
        staging = self._staging.numpy()
        staging[:, b:bucket] = 0
        staging[3, b:bucket] = 1  # padding rows see one token, in block 0
        staging[0, :b] = batch.input_ids
        staging[1, :b] = batch.positions
        staging[2, :b] = batch.slot_mapping
        staging[3, :b] = batch.seq_lens
        self.input_ids[:bucket].copy_(self._staging[0, :bucket], non_blocking=True)
        self.positions[:bucket].copy_(self._staging[1, :bucket], non_blocking=True)
        self.slot_mapping[:bucket].copy_(self._staging[2, :bucket], non_blocking=True)
        self.seq_lens[:bucket].copy_(self._staging[3, :bucket], non_blocking=True)
        width = batch.block_tables.shape[1]
        self.block_tables[:b, :width].copy_(torch.from_numpy(batch.block_tables),
                                            non_blocking=True)
        self._graphs[bucket].replay()
        return self._logits[bucket][:b]

    def _batch(self, b: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:b], positions=self.positions[:b],
            slot_mapping=self.slot_mapping[:b], query_start_loc=self.query_start_loc[:b + 1],
            seq_lens=self.seq_lens[:b], block_tables=self.block_tables[:b],
            logits_indices=self.logits_indices[:b], max_query_len=1,
            max_seq_len=self.model.max_model_len)
