"""Steps replayed from CUDA graphs: decode steps by batch size, mixed steps by token count.

A decode step (every row one token) has the same kernels at every step; only the contents of a
few small tensors change. So each bucket's forward is captured once over fixed input buffers, and
a step copies its rows into those buffers and replays the bucket just above its batch size. The
rows past the batch are padding: token 0 at position 0, writing its KV into the padding block 0
and reading one token from it (and in a state KV group, starting and leaving the padding slot
0's state); their logits are never looked at.

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
captures them one at a time when idle (`capture_next`). A server loaded from its first second
is never idle, so a step whose own bucket is still pending captures it first (`capture_for`,
each bucket once; the step in flight, if any, is ordered before the capture on the stream).
Until a bucket is captured a step replays a captured one at most `PAD_RATIO` times as large,
or runs eagerly."""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import torch

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.graph_inputs import GraphInputs, InputLayout, stage_decode, stage_mixed
from openinfer_core.interfaces.capabilities import (
    GraphPlan,
    supports_cuda_graphs,
    supports_graph_peers,
    supports_kv_groups,
)
from openinfer_core.interfaces.kv import KVGroupSpec
from openinfer_core.interfaces.model import ForwardBatch, HostBatch, Model, ModelFailedError

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


def own_bucket(buckets: Sequence[int], n: int) -> int | None:
    """The bucket a step of `n` rows (or tokens) belongs to: the smallest >= n, if any."""
    return next((s for s in buckets if s >= n), None)


def pick_bucket(buckets: Sequence[int], captured: Collection[int], n: int) -> int | None:
    """The captured bucket a step of `n` rows (or tokens) replays: the smallest captured one
    >= n, if it is at most `PAD_RATIO` times the bucket n belongs to; else None (eager)."""
    own = own_bucket(buckets, n)
    if own is None:
        return None
    if own in captured:
        return own
    larger = [s for s in captured if s >= n]
    return min(larger) if larger and min(larger) <= PAD_RATIO * own else None


class CudaGraphRunner:
    """Owns the fixed input buffers and one captured graph per bucket. Engine thread only."""

    def __init__(self, model: Model, max_batch: int, max_blocks_per_seq: int,
                 mixed_max_tokens: int = 0, kv_groups: tuple[KVGroupSpec, ...] = ()) -> None:
        self.model = model
        self.plan = GraphPlan(max_batch, max_blocks_per_seq, mixed_max_tokens, kv_groups)
        # Tensor-parallel rank 0: the workers capture and replay with it (looked up once, not
        # per replay).
        self._peers = model if supports_graph_peers(model) else None
        self.device = model.device
        self.max_batch = max_batch
        self.buckets = graph_buckets(max_batch)
        self.mixed = mixed_buckets(mixed_max_tokens)
        dev = self.device
        self.block_tables = torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int32,
                                        device=dev)
        self.group_block_tables = group_table_buffers(kv_groups, self.block_tables)
        # Each graph's token and request inputs, packed so a step lands them in one copy
        # (graph_inputs.py); the block tables are shared, copied as wide as the step needs.
        self._inputs = {("decode", b): GraphInputs(InputLayout(b, b, True), dev)
                        for b in self.buckets}
        self._inputs |= {("mixed", t): GraphInputs(InputLayout(t, min(t, max_batch), False),
                                                   dev) for t in self.mixed}
        words = max(i.layout.words for i in self._inputs.values())
        # Host staging, pinned so the copies are asynchronous. Two of them, used in turn: one
        # is rewritten only once its copies (two steps back) landed, so with overlapped steps
        # the host never waits for the step in flight.
        self._stagings = [torch.zeros(words, dtype=torch.int64).pin_memory() for _ in range(2)]
        self._host_views = [{k: i.layout.views(s.numpy()) for k, i in self._inputs.items()}
                            for s in self._stagings]
        self._copies = [torch.cuda.Event() for _ in range(2)]
        self._turn = 0
        self._staging = self._stagings[0]
        self._copied = self._copies[0]
        self._fill: tuple[torch.Tensor, torch.Tensor] | None = None
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}
        self._mixed_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._mixed_logits: dict[int, torch.Tensor] = {}
        # One logits buffer for every graph, each graph's output a view of its first rows: an
        # fp32 vocabulary-wide output per graph would take ~7 GiB for Qwen3-8B at 512
        # sequences, outside the step budget. A step's logits are read in stream order before
        # the next replay overwrites them.
        self._out: torch.Tensor | None = None
        self.capture_seconds = 0.0
        self.replays = {"decode": 0, "mixed": 0}
        self._pool: Any = None  # the graphs' shared memory pool
        self.pending: list[tuple[str, int]] = []  # buckets not captured yet, next first
        # Whether a step captured a bucket since the engine last gave host memory back
        # (`Engine.idle_work` does, once idle).
        self.captured_under_load = False

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

    def release(self) -> None:
        """Destroy every captured graph (none is replayed after): the collectives captured in
        them hold their NCCL communicator, whose teardown waits until they are gone. No
        device sync: after a rank died a replay may never end (the watchdog ends the process)."""
        for graphs in (self._graphs, self._mixed_graphs, self._logits, self._mixed_logits):
            graphs.clear()
        self.pending = []
        self._out = None
        self._pool = None

    def capture_next(self) -> bool:
        """Capture the next pending bucket; whether more are pending. Engine thread, between
        steps, with no step in flight."""
        if not self.pending:
            return False
        self._capture_pending(self.pending[0])
        return bool(self.pending)

    def capture_for(self, batch: HostBatch) -> bool:
        """Capture the bucket `batch` belongs to if it is still pending (whether it did):
        engine thread, before the step's forward, a step possibly in flight. Its replay and
        sampling are queued before the capture on the stream, so they read the shared tables
        and logits buffer before the capture's forwards write them, and the capture
        synchronises with the device before it starts."""
        key = self.own_key(batch)
        if key is None or key not in self.pending:
            return False
        started = time.perf_counter()
        try:
            self._capture_pending(key)
        except ModelFailedError:
            raise  # a tensor-parallel rank failed: no step can run
        except Exception as exc:  # e.g. out of memory: the step runs eagerly; not retried
            log.warning("CUDA graphs: capturing %s %d under load failed (%s: %s); steps of "
                        "that size run without it", *key, type(exc).__name__, exc)
            return False
        self.captured_under_load = True
        elapsed = time.perf_counter() - started
        self.capture_seconds += elapsed
        log.info("CUDA graphs: %s %d captured under load in %.2f s (%d left)", *key, elapsed,
                 len(self.pending))
        return True

    def own_key(self, batch: HostBatch) -> tuple[str, int] | None:
        """The graph `batch` belongs to (whether captured or not): a decode step's batch-size
        bucket, a mixed step's token bucket where its requests and block tables fit it; None
        where none does (it runs eagerly)."""
        if batch.is_decode:
            own = own_bucket(self.buckets, batch.num_seqs)
            return None if own is None else ("decode", own)
        tokens = len(batch.input_ids)
        own = own_bucket(self.mixed, tokens) if tokens else None
        if (own is None or batch.num_seqs > min(own, self.max_batch)
                or batch.block_tables.shape[1] > self.block_tables.shape[1]):
            return None
        return ("mixed", own)

    def _capture_pending(self, key: tuple[str, int]) -> None:
        """Capture pending `key`: the warm-up forward runs over its graph buffers, reset to
        padding first, so it writes only into the padding block 0."""
        self.pending.remove(key)
        started = time.perf_counter()
        self._inputs[key].reset()
        self._zero_tables()
        # A full collection costs more than a capture.
        self._capture_all([key], collect=False, reset=True)
        log.debug("CUDA graph %s %d captured in %.3f s", *key, time.perf_counter() - started)
        if not self.pending:
            log.info("CUDA graphs: every bucket captured")

    def _capture_all(self, keys: list[tuple[str, int]], collect: bool = True,
                     reset: bool = False) -> None:
        """Capture `keys`, together with the model's graph peers where it has them (`reset`:
        the buffers were reset to padding first, which the peers repeat)."""
        peers = (self._peers.capturing(self.plan, keys, reset) if self._peers is not None
                 else contextlib.nullcontext())
        # No garbage collection while capturing: freeing some other engine's graphs or events
        # in the middle of a capture invalidates it.
        if collect:
            gc.collect()
        gc.disable()
        try:
            with peers:
                self._capture(keys)
        finally:
            gc.enable()

    def capture_keys(self, keys: list[tuple[str, int]], reset: bool) -> None:
        """A graph peer's side of `_capture_all`: the same keys, after the same reset."""
        if reset:
            for key in keys:
                self._inputs[key].reset()
            self._zero_tables()
        self._capture_all(keys, collect=False)

    def _zero_tables(self) -> None:
        """Every table entry to the padding block 0."""
        self.block_tables.zero_()
        for table in self.group_block_tables:
            if table is not self.block_tables:
                table.zero_()

    def every_batch(self) -> list[ForwardBatch]:
        """The batches of every bucket's graph, as `capture` runs them (compile ahead)."""
        return [self._forward_batch(k) for k in self._inputs]

    def _capture(self, keys: list[tuple[str, int]]) -> None:
        batches = {k: self._forward_batch(k) for k in keys}
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
        graph's output, valid until the next replay). A model with graph peers (tensor-parallel
        ranks) is told first, so that they replay the same bucket."""
        key = self.key_of(batch)
        if self._peers is not None:
            self._peers.replaying(key, batch)
        return self.replay(key, batch, fill)

    def key_of(self, batch: HostBatch) -> tuple[str, int]:
        """The captured graph `batch` replays (`can_run` said it has one)."""
        if batch.is_decode:
            bucket = pick_bucket(self.buckets, self._graphs, batch.num_seqs)
        else:
            bucket = pick_bucket(self.mixed, self._mixed_graphs, len(batch.input_ids))
        assert bucket is not None, "can_run said no"
        return ("decode" if batch.is_decode else "mixed", bucket)

    def replay(self, key: tuple[str, int], batch: HostBatch,
               fill: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """`run` for the graph `key` (a graph peer replays the key rank 0 sent)."""
        self._turn ^= 1
        self._staging, self._copied = self._stagings[self._turn], self._copies[self._turn]
        self._copied.synchronize()
        self._fill = fill
        kind, bucket = key
        if kind == "decode":
            self._copy_in(key, batch, stage_decode)
            self._graphs[bucket].replay()
            self.replays["decode"] += 1
            return self._logits[bucket][:batch.num_seqs]
        self._copy_in(key, batch, stage_mixed)
        self._mixed_graphs[bucket].replay()
        self.replays["mixed"] += 1
        return self._mixed_logits[bucket][:len(batch.logits_indices)]

    def _copy_in(self, key: tuple[str, int], batch: HostBatch,
                 stage: Callable[[dict[str, np.ndarray], HostBatch], None]) -> None:
        """Two copies (and one per other KV group): the step's inputs laid out as `key`'s
        graph reads them, then its block tables; the fill's ids after the first. A state
        group's slots are copied over the whole buffer (`padded_slots`)."""
        inputs = self._inputs[key]
        stage(self._host_views[self._turn][key], batch)
        inputs.copy_from(self._staging)
        if self._fill is not None:
            inputs.views["input_ids"].index_copy_(0, *self._fill)
        b, width = batch.block_tables.shape
        # Pinned, or the copy could wait for the step in flight.
        tables = torch.from_numpy(batch.block_tables).pin_memory()
        self.block_tables[:b, :width].copy_(tables, non_blocking=True)
        for spec, table, host in zip(self.plan.kv_groups, self.group_block_tables,
                                     batch.group_block_tables, strict=True):
            if table is self.block_tables:  # the full group's: copied above
                continue
            if spec.state:  # the whole buffer: its padding rows on the padding slot
                host = padded_slots(host, table.shape[0])
                table.copy_(torch.from_numpy(host).pin_memory(), non_blocking=True)
            else:
                table[:b, :width].copy_(torch.from_numpy(host).pin_memory(), non_blocking=True)
        self._copied.record()

    def _forward_batch(self, key: tuple[str, int]) -> ForwardBatch:
        """The batch `key`'s graph runs: a decode graph's B rows of one token each; a mixed
        graph's T tokens over min(T, max_batch) request slots, with `max_query_len` = T, the
        most any request may have, so the attention picks kernels that handle every spread."""
        views = self._inputs[key].views
        slots = len(views["seq_lens"])
        return ForwardBatch(
            **views, block_tables=self.block_tables[:slots],
            max_query_len=1 if key[0] == "decode" else key[1],
            max_seq_len=self.model.max_model_len,
            group_block_tables=tuple(t[:slots] for t in self.group_block_tables))


def group_table_buffers(kv_groups: Sequence[KVGroupSpec],
                        block_tables: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """With several KV groups, one table buffer per group (`ForwardBatch.group_block_tables`):
    the first full group's is `block_tables`, as in the step's batch; a token group's is as
    wide, a state group's one slot per row (`[rows, 1]`, 0: the padding slot)."""
    if len(kv_groups) < 2:
        return ()
    full = next(g for g, spec in enumerate(kv_groups) if spec.is_full)
    return tuple(block_tables if g == full
                 else block_tables.new_zeros(block_tables.shape[0], 1) if spec.state
                 else torch.zeros_like(block_tables)
                 for g, spec in enumerate(kv_groups))


def padded_slots(slots: np.ndarray, rows: int) -> np.ndarray:
    """A state group's `[B, 1]` slots as a graph's whole `[rows, 1]` buffer: the rows past the
    step's are padding and get the padding slot 0. A token group's padding rows may keep old
    entries (they read them and write nothing, their KV going to block 0), but a state is read
    and written in place by every row: a padding row left on a request's slot would
    overwrite that request's state."""
    out = np.zeros((rows, 1), dtype=np.int32)
    out[:len(slots)] = slots
    return out


def new_graph_runner(config: EngineConfig, model: Model) -> CudaGraphRunner | None:
    """The engine's CUDA-graph runner for `model`, or None where steps run eagerly (not on
    CUDA, `enforce_eager`, a model that cannot be captured, an engine of pooling requests:
    their steps run eagerly)."""
    if model.device.type != "cuda" or config.enforce_eager or config.serves_embeddings():
        return None
    if not (supports_cuda_graphs(model) and model.cuda_graph_safe):
        log.info("decode runs eagerly: the model or its attention backend cannot be "
                 "captured in a CUDA graph")
        return None
    max_blocks = -(-model.max_model_len // config.block_size)
    mixed = min(model.cuda_graph_max_tokens, config.max_num_batched_tokens)
    groups = model.kv_groups if supports_kv_groups(model) else ()
    return CudaGraphRunner(model, min(config.max_num_seqs, GRAPH_MAX_BATCH), max_blocks, mixed,
                           groups)
