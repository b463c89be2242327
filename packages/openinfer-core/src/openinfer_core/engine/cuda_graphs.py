"""Steps replayed from CUDA graphs: decode steps by batch size, mixed steps by token count.

A decode step (every row one token) has the same kernels at every step; only the contents of a
few small tensors change. So each bucket's forward is captured once over fixed input buffers, and
a step copies its rows into those buffers and replays the bucket just above its batch size. The
rows past the batch are padding: token 0 at position 0, writing its KV into the padding block 0
and reading one token from it; their logits are never looked at.

When the model allows it (`cuda_graph_max_tokens`), steps of any other mix of up to that many
tokens (prefill chunks, prefix-cache hits, decodes beside them) are captured too, one graph per
token bucket T over min(T, max_batch) request slots. The attention kernels of such a graph find
each request's tokens on the device, so any spread of T tokens replays correctly; tokens past
the step's are padding (writing into block 0, owned by no request) and so are the request slots
past its requests (no query). These steps are the ones whose eager launches cost more host time
than the GPU spends on them: a warm prefix-cache hit is such a step.

Capturing every bucket at start costs ~0.1 s each. `capture(start_only=True)` captures the
buckets a start needs most (`start_buckets`: small decodes, and the largest decode and mixed
graphs, which also size the shared memory pool) and leaves the rest pending; the engine thread
captures them one at a time when idle (`capture_next`), never while a step is in flight. Until
a step's bucket is captured it replays a captured one at most `PAD_RATIO` times as large, or
runs eagerly."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import torch

from openinfer_core.engine.batch import HostBatch
from openinfer_core.engine.config import EngineConfig
from openinfer_core.interfaces.model import ForwardBatch, Model

log = logging.getLogger("openinfer")

GRAPH_MAX_BATCH = 512  # the largest decode batch replayed from a graph

START_DECODE_MAX = 16  # decode buckets up to this one are captured at start
PAD_RATIO = 2  # a step may replay a captured bucket up to this many times its own bucket


def graph_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, 16, then every 16 up to `max_batch` (which is always a bucket)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch]
    sizes += list(range(16, max_batch, 16))
    return [*sizes, max_batch]


def mixed_buckets(max_tokens: int) -> list[int]:
    """16, 32, every 64 up to 512, then every 256 up to `max_tokens` (always a bucket); none
    below 16 tokens. Past 512 a step pads at most 255 tokens (under a third of it), and a few
    graphs cover the steps where hundreds of decodes meet a burst of new prompts."""
    if max_tokens < 16:
        return []
    sizes = [t for t in (16, 32) if t < max_tokens]
    sizes += list(range(64, min(max_tokens, 513), 64))
    sizes += list(range(768, max_tokens, 256))
    return sorted({*(s for s in sizes if s < max_tokens), max_tokens})


def start_buckets(decode: Sequence[int], mixed: Sequence[int]) -> set[tuple[str, int]]:
    """The (kind, size) graphs captured at start when the rest may wait: decode buckets up
    to `START_DECODE_MAX`, the largest decode bucket and the largest mixed one."""
    keep = {("decode", b) for b in decode if b <= START_DECODE_MAX}
    keep |= {("decode", decode[-1])} if decode else set()
    return keep | ({("mixed", mixed[-1])} if mixed else set())


def pick_bucket(buckets: Sequence[int], captured: Collection[int], n: int) -> int | None:
    """The captured bucket a step of `n` rows (or tokens) replays: the smallest captured one
    >= n, if it is at most `PAD_RATIO` times the bucket n belongs to; else None (eager)."""
    own = next((s for s in buckets if s >= n), None)
    if own is None:
        return None
    if own in captured:
        return own
    larger = [s for s in captured if s >= n]
    return min(larger) if larger and min(larger) <= PAD_RATIO * own else None


def stage_mixed(staging: np.ndarray, batch: HostBatch, bucket: int, slots: int) -> None:
    """Lay a mixed step out in the staging rows (ids, positions, slots, seq_lens,
    query_start_loc, logits_indices) as a `bucket`-token graph over `slots` requests reads it:
    padding tokens are token 0 at position 0 writing into block 0; padding requests see one
    token and own none; padding sampled rows read row 0."""
    t, b, k = len(batch.input_ids), batch.num_seqs, len(batch.logits_indices)
    staging[:3, t:bucket] = 0
    staging[0, :t] = batch.input_ids
    staging[1, :t] = batch.positions
    staging[2, :t] = batch.slot_mapping
    staging[3, :b] = batch.seq_lens
    staging[3, b:slots] = 1
    staging[4, :b + 1] = batch.query_start_loc
    staging[4, b + 1:slots + 1] = t
    staging[5, :k] = batch.logits_indices
    staging[5, k:slots] = 0


class CudaGraphRunner:
    """Owns the fixed input buffers and one captured graph per bucket. Engine thread only."""

    def __init__(self, model: Model, max_batch: int, max_blocks_per_seq: int,
                 mixed_max_tokens: int = 0) -> None:
        self.model = model
        self.device = model.device
        self.max_batch = max_batch
        self.buckets = graph_buckets(max_batch)
        self.mixed = mixed_buckets(mixed_max_tokens)
        n = max(max_batch, self.mixed[-1] if self.mixed else 0)
        dev = self.device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.zeros(n, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int32,
                                        device=dev)
        # Decode graphs: request b owns token b and samples it, always.
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=dev)
        self.logits_indices = torch.arange(max_batch, dtype=torch.int64, device=dev)
        # Mixed graphs: both rewritten every step.
        self.mixed_query_start_loc = torch.zeros(max_batch + 1, dtype=torch.int32, device=dev)
        self.mixed_logits_indices = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        # Host staging, pinned so the copies are asynchronous. Rows: ids, positions, slots,
        # seq_lens, query_start_loc, logits_indices. Two of them, used in turn: one is rewritten
        # only once its copies (two steps back) landed, so with overlapped steps the host never
        # waits for the step in flight.
        self._stagings = [torch.zeros(6, max(n, max_batch + 1), dtype=torch.int64).pin_memory()
                          for _ in range(2)]
        self._copies = [torch.cuda.Event() for _ in range(2)]
        self._turn = 0
        self._staging = self._stagings[0]
        self._copied = self._copies[0]
        self._fill: tuple[torch.Tensor, torch.Tensor] | None = None
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}
        self._mixed_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._mixed_logits: dict[int, torch.Tensor] = {}
        # One logits buffer for every graph, each graph's output a view of its first rows. Each
        # graph kept its own fp32 vocabulary-wide output before: ~7 GiB for Qwen3-8B at 512
        # sequences, outside the step budget (run 72). A step's logits are read in stream order
        # before the next replay overwrites them, as one graph's own output always was.
        self._out: torch.Tensor | None = None
        self.capture_seconds = 0.0
        self.replays = {"decode": 0, "mixed": 0}
        self._pool: Any = None  # the graphs' shared memory pool
        self.pending: list[tuple[str, int]] = []  # buckets not captured yet, next first

    def capture(self, start_only: bool = False) -> None:
        """Warm the buckets up (compiling their kernels), then capture, largest first so the
        smaller graphs reuse the larger ones' memory pool. `start_only`: only
        `start_buckets`, the others go to `pending` (smallest first) for `capture_next`."""
        started = time.perf_counter()
        every = [("decode", b) for b in self.buckets] + [("mixed", t) for t in self.mixed]
        now = start_buckets(self.buckets, self.mixed) if start_only else set(every)
        self.pending = sorted((k for k in every if k not in now), key=lambda k: (k[1], k[0]))
        self._capture_all(sorted(now, key=lambda k: -k[1]))
        self.capture_seconds = time.perf_counter() - started
        log.info("CUDA graphs: captured %d decode batch sizes and %d mixed-step token counts "
                 "in %.2f s; %d left to capture when idle", len(self._graphs),
                 len(self._mixed_graphs), self.capture_seconds, len(self.pending))

    def capture_next(self) -> bool:
        """Capture the next pending bucket; whether more are pending. Engine thread, between
        steps, with no step in flight: the warm-up forward runs over the graph buffers (reset
        to padding first, so it writes only into the padding block 0)."""
        if not self.pending:
            return False
        key = self.pending.pop(0)
        started = time.perf_counter()
        self._reset_buffers()
        self._capture_all([key], collect=False)  # a full collection costs more than a capture
        log.debug("CUDA graph %s %d captured in %.3f s", *key, time.perf_counter() - started)
        if not self.pending:
            log.info("CUDA graphs: every bucket captured")
        return bool(self.pending)

    def _capture_all(self, keys: list[tuple[str, int]], collect: bool = True) -> None:
        # No garbage collection while capturing: freeing some other engine's graphs or events
        # in the middle of a capture invalidates it.
        if collect:
            gc.collect()
        gc.disable()
        try:
            self._capture(keys)
        finally:
            gc.enable()

    def every_batch(self) -> list[ForwardBatch]:
        """The batches of every bucket's graph, as `capture` runs them (compile ahead)."""
        return [self._batch(b) for b in self.buckets] + [self._mixed_batch(t)
                                                         for t in self.mixed]

    def _capture(self, keys: list[tuple[str, int]]) -> None:
        batches = {k: self._batch(k[1]) if k[0] == "decode" else self._mixed_batch(k[1])
                   for k in keys}
        with torch.inference_mode():
            for batch in batches.values():
                logits = self.model.forward(batch)
            if self._out is None:
                self._out = torch.empty(self.max_batch, logits.shape[1], dtype=logits.dtype,
                                        device=self.device)
            del logits
            torch.cuda.synchronize(self.device)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            for (kind, size), batch in batches.items():
                batch.logits_out = self._out
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool):
                    logits = self.model.forward(batch)
                    out = self._out[:logits.shape[0]]
                    if logits.data_ptr() != out.data_ptr():  # a model that ignored logits_out
                        out.copy_(logits)
                del logits  # back to the pool, for the next capture
                graphs, outputs = ((self._graphs, self._logits) if kind == "decode"
                                   else (self._mixed_graphs, self._mixed_logits))
                graphs[size], outputs[size] = graph, out
            torch.cuda.synchronize(self.device)

    def _reset_buffers(self) -> None:
        """The buffers as at start: every token padding, in block 0."""
        for buf in (self.input_ids, self.positions, self.slot_mapping, self.block_tables,
                    self.mixed_query_start_loc, self.mixed_logits_indices):
            buf.zero_()
        self.seq_lens.fill_(1)

    def can_run(self, batch: HostBatch) -> bool:
        if batch.is_decode:
            return pick_bucket(self.buckets, self._graphs, batch.num_seqs) is not None
        num_tokens = len(batch.input_ids)
        if num_tokens < 1:
            return False
        bucket = pick_bucket(self.mixed, self._mixed_graphs, num_tokens)
        return (bucket is not None and batch.num_seqs <= min(bucket, self.max_batch)
                and batch.block_tables.shape[1] <= self.block_tables.shape[1])

    def run(self, batch: HostBatch,
            fill: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Copy `batch` into the buffers, write `fill`'s token ids (device values: positions,
        ids) over its pending slots, replay its bucket; fp32 logits [S, V] (a view of the
        graph's output, valid until the next replay)."""
        self._turn ^= 1
        self._staging, self._copied = self._stagings[self._turn], self._copies[self._turn]
        self._copied.synchronize()
        self._fill = fill
        if batch.is_decode:
            return self._run_decode(batch)
        return self._run_mixed(batch)

    def _run_decode(self, batch: HostBatch) -> torch.Tensor:
        b = batch.num_seqs
        bucket = pick_bucket(self.buckets, self._graphs, b)
        assert bucket is not None, "can_run said no"
        staging = self._staging.numpy()
        staging[:4, b:bucket] = 0
        staging[3, b:bucket] = 1  # padding rows see one token, in block 0
        staging[0, :b] = batch.input_ids
        staging[1, :b] = batch.positions
        staging[2, :b] = batch.slot_mapping
        staging[3, :b] = batch.seq_lens
        self._copy_tokens(bucket)
        self.seq_lens[:bucket].copy_(self._staging[3, :bucket], non_blocking=True)
        self._copy_tables(batch)
        self._graphs[bucket].replay()
        self.replays["decode"] += 1
        return self._logits[bucket][:b]

    def _run_mixed(self, batch: HostBatch) -> torch.Tensor:
        t, k = len(batch.input_ids), len(batch.logits_indices)
        bucket = pick_bucket(self.mixed, self._mixed_graphs, t)
        assert bucket is not None, "can_run said no"
        slots = min(bucket, self.max_batch)
        stage_mixed(self._staging.numpy(), batch, bucket, slots)
        self._copy_tokens(bucket)
        self.seq_lens[:slots].copy_(self._staging[3, :slots], non_blocking=True)
        self.mixed_query_start_loc[:slots + 1].copy_(self._staging[4, :slots + 1],
                                                     non_blocking=True)
        self.mixed_logits_indices[:slots].copy_(self._staging[5, :slots], non_blocking=True)
        self._copy_tables(batch)
        self._mixed_graphs[bucket].replay()
        self.replays["mixed"] += 1
        return self._mixed_logits[bucket][:k]

    def _copy_tokens(self, n: int) -> None:
        self.input_ids[:n].copy_(self._staging[0, :n], non_blocking=True)
        if self._fill is not None:
            self.input_ids.index_copy_(0, *self._fill)
        self.positions[:n].copy_(self._staging[1, :n], non_blocking=True)
        self.slot_mapping[:n].copy_(self._staging[2, :n], non_blocking=True)

    def _copy_tables(self, batch: HostBatch) -> None:
        b, width = batch.block_tables.shape
        # Pinned, or the copy could wait for the step in flight.
        tables = torch.from_numpy(batch.block_tables).pin_memory()
        self.block_tables[:b, :width].copy_(tables, non_blocking=True)
        self._copied.record()

    def _batch(self, b: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:b], positions=self.positions[:b],
            slot_mapping=self.slot_mapping[:b], query_start_loc=self.query_start_loc[:b + 1],
            seq_lens=self.seq_lens[:b], block_tables=self.block_tables[:b],
            logits_indices=self.logits_indices[:b], max_query_len=1,
            max_seq_len=self.model.max_model_len)

    def _mixed_batch(self, t: int) -> ForwardBatch:
        """T tokens over min(T, max_batch) request slots; `max_query_len` = T, the most any
        request may have, so the attention picks kernels that handle every spread."""
        s = min(t, self.max_batch)
        return ForwardBatch(
            input_ids=self.input_ids[:t], positions=self.positions[:t],
            slot_mapping=self.slot_mapping[:t],
            query_start_loc=self.mixed_query_start_loc[:s + 1], seq_lens=self.seq_lens[:s],
            block_tables=self.block_tables[:s], logits_indices=self.mixed_logits_indices[:s],
            max_query_len=t, max_seq_len=self.model.max_model_len)


def new_graph_runner(config: EngineConfig, model: Model) -> CudaGraphRunner | None:
    """The engine's CUDA-graph runner for `model`, or None where steps run eagerly (not on
    CUDA, `enforce_eager`, a model that cannot be captured)."""
    if model.device.type != "cuda" or config.enforce_eager:
        return None
    if not getattr(model, "cuda_graph_safe", False):
        log.info("decode runs eagerly: the model or its attention backend cannot be "
                 "captured in a CUDA graph")
        return None
    max_blocks = -(-model.max_model_len // config.block_size)
    mixed = min(int(getattr(model, "cuda_graph_max_tokens", 0)), config.max_num_batched_tokens)
    return CudaGraphRunner(model, min(config.max_num_seqs, GRAPH_MAX_BATCH), max_blocks, mixed)
