"""`--tensor-parallel-size N`: rank 0 of a model split over N processes, behind the `Model`
protocol, so the engine loop does not change.

The engine's process is rank 0: it loads shard 0 through the model line itself and spawns one
worker process per other rank (`worker.py`), each loading its own shard and KV cache (the
same block count). Each step, rank 0 publishes one small message over a ZeroMQ XPUB (IPC on
one host, TCP across nodes): the step's host image (`interfaces.model.HostBatch`: positions,
slots, block tables, ...), and which CUDA graph replays it, if one does. Every rank builds its
own device inputs from it. The token ids travel on the device instead: each rank's forward
starts with a broadcast of rank 0's ids, so ids sampled by the step before never come back to
the host first, and overlapped steps keep overlapping. The shards' collectives meet inside the
model line's forward; rank 0 samples from the full-vocabulary logits.

CUDA graphs: every rank captures the same buckets at the same time (`capturing`: rank 0's
`CudaGraphRunner` tells the workers before each capture) and replays the bucket rank 0 names
(`replaying`), collectives inside the graphs.

Failure: every wait outside the graphs is bounded (collectives by the group's timeout,
start-up by `start_timeout_s`); a dead worker or a failed collective makes `forward` raise
`ModelFailedError`, and every later call too. A collective inside a CUDA graph (or a
symmetric-memory barrier) never times out, so on CUDA a watchdog thread ends this process when
a rank dies and the engine has not closed the model within `HANG_GRACE_S`: its caller (the
server's engine process) then fails every request as for a dead engine."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import zmq

from openinfer_core.distributed.group import TorchTensorParallelGroup
from openinfer_core.distributed.local_ranks import (
    LocalRank,
    local_ranks,
    rank_device,
    stop_ranks,
)
from openinfer_core.distributed.nodes import (
    NodeLayout,
    RemoteRank,
    group_store,
    open_store,
    publish,
)
from openinfer_core.distributed.worker import WorkerSpec
from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.capabilities import (
    GraphPlan,
    create_kv_cache_of,
    supports_cuda_graphs,
    supports_expert_parallel,
    supports_kv_groups,
    supports_pooling,
    supports_sampling_kernels,
    supports_tensor_parallel,
    supports_weight_bytes,
)
from openinfer_core.interfaces.kv import KVManager, KVStepLimits
from openinfer_core.interfaces.model import (
    ForwardBatch,
    HostBatch,
    LoadOptions,
    Model,
    ModelFailedError,
    ModelLine,
)

log = logging.getLogger("openinfer")

# Seconds any collective may wait for the other ranks (a layer's compute on the slowest rank,
# a first-step kernel compile): past it the step fails instead of hanging.
TIMEOUT_ENV = "OPENINFER_TP_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 120.0
START_TIMEOUT_S = 1800.0  # loading a shard: large checkpoints from slow disks
STOP_LINGER_MS = 2000  # for "stop" to leave over TCP before the socket closes
WATCH_S = 0.2  # how often the watchdog looks at the workers
# After a rank died, how long the engine has to notice (its next step raises) and close the
# model before the watchdog ends the process: a step stuck in a graph's collective never ends.
HANG_GRACE_S = 5.0


def check_expert_parallel(line: type[ModelLine], asked: bool) -> None:
    """Refuse `--enable-expert-parallel` for a model line without routed experts (or that
    cannot split them)."""
    if asked and not supports_expert_parallel(line):
        raise ModelConfigError(
            f"model line {line.name!r} has no routed experts to split: "
            "leave out --enable-expert-parallel")


def _target(obj: type) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


class TensorParallelModel:
    """Rank 0's face of a tensor-parallel model (`interfaces.model.Model`). Build it with
    `start`; `close()` stops the workers (the engine thread, or after it stopped)."""

    def __init__(self, local: Model, group: TorchTensorParallelGroup,
                 workers: list[LocalRank | RemoteRank], publisher: zmq.Socket[bytes],
                 context: zmq.Context[Any], folder: Path,
                 store: dist.Store | None = None) -> None:
        self.local = local
        self.group = group
        self.workers = workers
        self.vocab_size = local.vocab_size
        self.max_model_len = local.max_model_len
        self.device = local.device
        self.size = group.size
        # Rank 0's capabilities. CUDA graphs (SupportsCudaGraphs, SupportsGraphPeers) where the
        # shard can be captured: its `cuda_graph_safe` says so, with expert parallelism too
        # (a line whose expert-parallel steps sync with the host sets it False).
        self.weight_bytes = local.weight_bytes if supports_weight_bytes(local) else 0
        if supports_sampling_kernels(local):
            self.sampling_kernels = local.sampling_kernels
        self.cuda_graph_safe = False
        self.cuda_graph_max_tokens = 0
        if supports_cuda_graphs(local) and local.cuda_graph_safe:
            self.cuda_graph_safe = True
            self.cuda_graph_max_tokens = local.cuda_graph_max_tokens
        # SupportsPooling: every rank ends with the whole (replicated) final hidden state.
        self.pooling_hidden_size = local.pooling_hidden_size if supports_pooling(local) else 0
        if supports_kv_groups(local):  # SupportsKVGroups, with `create_kv_cache`'s limits
            self.kv_groups = local.kv_groups
            self.kv_window_bytes = local.kv_window_bytes
        self._capturing = False
        self._publisher = publisher
        self._context = context
        self._folder = folder
        self._store = store  # several nodes: the TCP store this process hosts
        self._failed: str | None = None
        self._closed = False
        self._watchdog: threading.Thread | None = None
        if self.device.type == "cuda":
            self._watchdog = threading.Thread(target=self._watch, name="openinfer-tp-watchdog",
                                              daemon=True)
            self._watchdog.start()

    @classmethod
    def start(cls, line: type[ModelLine], model_dir: Path, config: dict[str, Any],
              options: LoadOptions, size: int, *, timeout_s: float | None = None,
              start_timeout_s: float = START_TIMEOUT_S,
              layout: NodeLayout | None = None) -> TensorParallelModel:
        """Spawn this node's ranks 1.., load shard 0 here, and wait until every rank (the other
        nodes' too, `layout`) is loaded. `line` is the model line class
        (`supports_tensor_parallel` must be set)."""
        if not supports_tensor_parallel(line):
            raise ModelConfigError(
                f"model line {line.name!r} does not support tensor "
                "parallelism: use --tensor-parallel-size 1")
        check_expert_parallel(line, options.expert_parallel)
        if timeout_s is None:
            timeout_s = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
        layout = layout or NodeLayout()
        if size % layout.nnodes:
            raise ModelConfigError(f"--tensor-parallel-size {size} does not split over "
                                   f"--nnodes {layout.nnodes}: give each node as many ranks")
        folder = Path(tempfile.mkdtemp(prefix="openinfer-tp-"))
        context: zmq.Context[Any] = zmq.Context()
        publisher = context.socket(zmq.XPUB)
        publisher.setsockopt(zmq.XPUB_VERBOSE, 1)  # one message per subscriber that joins
        publisher.setsockopt(zmq.SNDHWM, 0)  # never drop a step
        publisher.setsockopt(zmq.LINGER, 0)
        store = None
        if layout.nnodes > 1:  # the other nodes reach the batches over TCP
            publisher.bind("tcp://*:0")
            port = publisher.getsockopt(zmq.LAST_ENDPOINT).decode().rpartition(":")[2]
            address = f"tcp://{layout.master_addr}:{port}"
            store = open_store(layout, start_timeout_s, host=True)
        else:
            address = f"ipc://{folder}/batches"
            publisher.bind(address)
        base = _spec_base(line, model_dir, config, options, size, folder, address, timeout_s)
        if store is not None:
            base = dataclasses.replace(
                base, store_path="", nnodes=layout.nnodes,
                store_address=f"{layout.master_addr}:{layout.master_port}")
        per_node = layout.ranks_per_node(size)
        workers: list[LocalRank | RemoteRank] = [LocalRank.spawn(dataclasses.replace(
            base, rank=r, device=rank_device(options.device, r))) for r in range(1, per_node)]
        if store is not None:
            publish(store, "spec", base)  # what the other nodes' ranks load
            workers += [RemoteRank(r, r // per_node, store) for r in range(per_node, size)]
        group = None
        try:
            group = TorchTensorParallelGroup(
                0, size, options.device, folder / "store" if store is None else group_store(store),
                timeout_s)
            local = line.load(model_dir, config,
                              dataclasses.replace(options, tensor_parallel=group))
            deadline = time.monotonic() + start_timeout_s
            for worker in workers:
                worker.wait_for("ready", deadline)
            _wait_subscribers(publisher, size - 1, deadline)
        except BaseException:
            stop_ranks(workers, timeout=0.0)
            if group is not None:  # its other ranks are killed: no teardown to wait for
                group.close(0.0, abort=True)
            context.destroy(linger=0)
            shutil.rmtree(folder, ignore_errors=True)
            raise
        log.info("tensor parallel: %d ranks (%s) on %d node(s), local worker pids %s", size,
                 options.device, layout.nnodes, [w.process.pid for w in local_ranks(workers)])
        return cls(local, group, workers, publisher, context, folder, store)

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Rank 0's: its shard is the largest (`sharding` gives earlier ranks the larger
        parts), and every rank allocates the same number of blocks."""
        return self.local.kv_bytes_per_block(block_size)

    def create_kv_cache(self, num_blocks: int, block_size: int,
                        limits: KVStepLimits | None = None) -> KVManager:
        """Every rank's (`limits`: the window groups' sizing, `SupportsKVGroups`)."""
        self._publish(("kv", num_blocks, block_size, limits))
        kv = create_kv_cache_of(self.local, num_blocks, block_size, limits)
        deadline = time.monotonic() + self.group.timeout_s
        try:
            for worker in self.workers:
                worker.wait_for("kv", deadline)
        except ModelFailedError as exc:
            self._failed = str(exc)
            raise
        return kv

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Every rank runs `batch`; returns rank 0's logits (the full vocabulary). Inside
        `capturing` the workers run their own captures: nothing is sent."""
        self._check_alive()
        try:
            if not self._capturing:
                self._publish(("forward", HostBatch.of(batch)))
            return self._forward(batch)
        except Exception as exc:
            raise self._fail(f"{type(exc).__name__}: {exc}") from exc

    def forward_hidden(self, batch: ForwardBatch) -> torch.Tensor:
        """Every rank runs `batch` up to the final norm (`SupportsPooling`); returns rank 0's
        hidden states. Never inside a graph."""
        self._check_alive()
        local = self.local
        if not supports_pooling(local):
            raise RuntimeError("forward_hidden on a shard without SupportsPooling")
        try:
            self._publish(("forward_hidden", HostBatch.of(batch)))
            self.group.broadcast(batch.input_ids)
            return local.forward_hidden(batch)
        except Exception as exc:
            raise self._fail(f"{type(exc).__name__}: {exc}") from exc

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        # Rank 0's token ids reach every rank on the device (the workers' forward starts with
        # the same broadcast): ids the step before sampled stay where they are.
        self.group.broadcast(batch.input_ids)
        return self.local.forward(batch)

    @contextlib.contextmanager
    def capturing(self, plan: GraphPlan, keys: Sequence[tuple[str, int]],
                  reset: bool) -> Iterator[None]:
        """capabilities.SupportsGraphPeers: the workers capture `keys` as rank 0 does."""
        self._check_alive()
        self._publish(("capture", plan, list(keys), reset))
        self._capturing = True
        try:
            yield
        except ModelFailedError:  # a forward inside failed the group already
            raise
        except Exception as exc:
            raise self._fail(f"capturing CUDA graphs: {type(exc).__name__}: {exc}") from exc
        finally:
            self._capturing = False

    def started(self) -> None:
        """capabilities.SupportsStarted: start-up is done; on CUDA each worker logs the kernels
        it compiles from now on (a rank's compile stalls every rank at the next collective)."""
        self._check_alive()
        self._publish(("started",))

    def replaying(self, key: tuple[str, int], host: HostBatch) -> None:
        """capabilities.SupportsGraphPeers: the workers replay `key` over `host`."""
        self._check_alive()
        self._publish(("replay", key, host))

    def _check_alive(self) -> None:
        if self._failed is not None:
            raise ModelFailedError(self._failed)
        dead = [w.rank for w in self.workers if not w.alive()]
        if dead:
            raise self._fail(f"rank(s) {dead} died before this step")

    def _watch(self) -> None:
        """The watchdog (CUDA only): a dead rank makes the engine's next step raise, unless
        that step is stuck in a collective inside a graph; then the process ends."""
        while not self._closed:
            time.sleep(WATCH_S)
            dead = [w.rank for w in self.workers if not w.alive()]
            if not dead or self._closed:
                continue
            deadline = time.monotonic() + HANG_GRACE_S
            while not self._closed and time.monotonic() < deadline:
                time.sleep(WATCH_S)
            if self._closed:
                return
            log.critical("tensor-parallel rank(s) %s died and the engine did not stop within "
                         "%.0f s (a collective inside a CUDA graph never times out): ending "
                         "this process", dead, HANG_GRACE_S)
            for worker in local_ranks(self.workers):
                with contextlib.suppress(Exception):
                    worker.process.kill()
            os._exit(1)

    def _publish(self, message: tuple[Any, ...]) -> None:
        self._publisher.send(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def _fail(self, why: str) -> ModelFailedError:
        """The group is out of step for good: say why, with what the workers said."""
        multiprocessing.connection.wait(
            [w.process.sentinel for w in local_ranks(self.workers)], 1.0)
        notes = [note for w in self.workers if (note := w.describe_exit()) is not None]
        self._failed = (f"tensor parallelism failed ({self.size} ranks): {why}"
                        + "".join(f"\n{n}" for n in notes if n not in why))
        log.error("%s", self._failed)
        return ModelFailedError(self._failed)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the workers (asked, then killed after `timeout`) and leave the group.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        linger = 0
        healthy = self._failed is None and all(w.alive() for w in local_ranks(self.workers))
        if self._failed is None:
            with contextlib.suppress(zmq.ZMQError):  # the workers are killed below anyway
                self._publish(("stop",))
            if self._store is not None:  # over TCP: let "stop" reach the other nodes
                linger = STOP_LINGER_MS
        # The workers leave the group on "stop" and NCCL's teardown waits for every rank: leave
        # with them, before waiting for them to exit. With a rank gone, the teardown could only
        # time out: it gets no wait.
        self.group.close(timeout if healthy else 0.0, abort=not healthy)
        stop_ranks(self.workers, timeout)
        self._context.destroy(linger=linger)
        self._store = None  # the TCP store goes: the other nodes' agents stop what is left
        shutil.rmtree(self._folder, ignore_errors=True)


def _spec_base(line: Any, model_dir: Path, config: dict[str, Any], options: LoadOptions,
               size: int, folder: Path, address: str, timeout_s: float) -> WorkerSpec:
    return WorkerSpec(
        rank=0, size=size, model_line=_target(line), attention=_target(type(options.attention)),
        model_dir=str(model_dir), hf_config=config, device=str(options.device),
        dtype=str(options.dtype).removeprefix("torch."), max_model_len=options.max_model_len,
        load_format=options.load_format, expert_parallel=options.expert_parallel,
        quantization=options.quantization,
        kv_cache_dtype=str(options.kv_cache_dtype or "").removeprefix("torch."),
        store_path=str(folder / "store"),
        batch_address=address, timeout_s=timeout_s,
        num_threads=torch.get_num_threads() if options.device.type == "cpu" else 0,
        log_level=logging.getLevelName(log.getEffectiveLevel()).lower())


def _wait_subscribers(publisher: zmq.Socket[bytes], count: int, deadline: float) -> None:
    """Until `count` workers subscribed to the XPUB: a message published before a
    subscription arrives would be lost (ZeroMQ's slow joiner)."""
    for _ in range(count):
        left_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
        if not publisher.poll(left_ms):
            raise ModelFailedError("tensor-parallel workers did not subscribe in time")
        publisher.recv()
