"""A tensor-parallel rank other than 0: its own process, its own shard and KV cache.

    join the group, load the shard, say `ready` on the pipe
    loop: wait for rank 0's next message (a thread ends the process if rank 0's is gone)
          kv      -> allocate the KV cache, say `kv` on the pipe
          forward -> build the step's inputs on this device from its host image, run the
                     shard's forward (rank 0's token ids broadcast first, collectives inside)
          capture -> capture the CUDA graphs rank 0 captures, in step with it
          replay  -> replay the graph rank 0 replays, over the step's host image
          stop    -> leave

Any failure is reported on the pipe (`error`, the traceback) and ends the process: rank 0's
collectives then fail at once (gloo: the connection closes) or at their timeout. A watchdog
thread ends the process when rank 0's is gone, even while a step waits in a collective inside
a graph (which never times out)."""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import zmq

from openinfer_core.distributed.group import TorchTensorParallelGroup
from openinfer_core.distributed.nodes import NodeLayout, group_store, open_store
from openinfer_core.engine.cuda_graphs import CudaGraphRunner
from openinfer_core.interfaces.capabilities import (
    GraphPlan,
    create_kv_cache_of,
    supports_pooling,
)
from openinfer_core.interfaces.kv import KVManager, KVStepLimits
from openinfer_core.interfaces.model import ForwardBatch, HostBatch, LoadOptions, Model
from openinfer_core.late_compiles import log_late_compiles
from openinfer_core.registry import import_target

log = logging.getLogger("openinfer")

ORPHAN_CHECK_S = 0.5  # how often the watchdog thread checks that rank 0 is alive


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything a worker needs to load its shard (picklable: it crosses a spawn)."""

    rank: int
    size: int
    model_line: str  # "module:Class"
    attention: str  # "module:Class", built as cls()
    model_dir: str
    hf_config: dict[str, Any]
    device: str
    dtype: str  # torch dtype name, e.g. "float32"
    max_model_len: int | None
    load_format: str
    expert_parallel: bool
    kv_cache_dtype: str  # torch dtype name of the KV pages, "" for the model's dtype
    store_path: str  # the group's file store (one node)
    batch_address: str  # rank 0's ZeroMQ XPUB
    timeout_s: float
    num_threads: int  # torch intra-op threads on CPU (0: torch's default)
    log_level: str
    # Several nodes: the TCP store's "host:port" (in place of store_path) and the node layout.
    store_address: str = ""
    nnodes: int = 1
    quantization: str | None = None  # LoadOptions.quantization


def run_worker(spec: WorkerSpec, conn: multiprocessing.connection.Connection) -> None:
    """The worker process's entry point. It outlives no rank 0: a thread watches for its end
    (`_exit_when_orphaned`), whatever the main thread waits on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0's process decides when we stop
    logging.basicConfig(level=spec.log_level.upper(), stream=sys.stderr,
                        format=f"%(levelname)s %(asctime)s [tp{spec.rank}] %(message)s")
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True,
                     name="openinfer-tp-orphan-watch").start()
    if spec.num_threads:
        torch.set_num_threads(spec.num_threads)
    context = zmq.Context()
    group = None
    stopped = False  # "stop" came: the ranks leave the group together
    try:
        batches = context.socket(zmq.SUB)
        batches.setsockopt(zmq.RCVHWM, 0)
        batches.setsockopt(zmq.SUBSCRIBE, b"")
        batches.connect(spec.batch_address)
        device = torch.device(spec.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        group = TorchTensorParallelGroup(spec.rank, spec.size, device, _store(spec),
                                         spec.timeout_s)
        model = _load(spec, group, device)
        conn.send(("ready", None))
        _serve(RankModel(model, group), batches, conn)
        stopped = True
    except BaseException:
        with contextlib.suppress(OSError):  # rank 0 is gone: nobody to tell
            conn.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        if group is not None:
            group.close(spec.timeout_s if stopped else 0.0, abort=not stopped)
        context.destroy(linger=0)


def _store(spec: WorkerSpec) -> Path | dist.Store:
    if not spec.store_address:
        return Path(spec.store_path)
    addr, _, port = spec.store_address.rpartition(":")
    layout = NodeLayout(nnodes=spec.nnodes, master_addr=addr, master_port=int(port))
    return group_store(open_store(layout, spec.timeout_s, host=False))


def _load(spec: WorkerSpec, group: TorchTensorParallelGroup, device: torch.device) -> Model:
    options = LoadOptions(device=device, dtype=getattr(torch, spec.dtype),
                          attention=import_target(spec.attention)(),
                          max_model_len=spec.max_model_len, load_format=spec.load_format,
                          quantization=spec.quantization, tensor_parallel=group,
                          expert_parallel=spec.expert_parallel,
                          kv_cache_dtype=getattr(torch, spec.kv_cache_dtype)
                          if spec.kv_cache_dtype else None)
    model: Model = import_target(spec.model_line).load(Path(spec.model_dir), spec.hf_config,
                                                      options)
    return model


class RankModel:
    """A worker's shard as its steps and CUDA graphs run it: rank 0's token ids first, then
    the shard's forward (`interfaces.model.Model`, for the worker's `CudaGraphRunner`)."""

    def __init__(self, local: Model, group: TorchTensorParallelGroup) -> None:
        self.local = local
        self.group = group
        self.vocab_size = local.vocab_size
        self.max_model_len = local.max_model_len
        self.device = local.device

    def kv_bytes_per_block(self, block_size: int) -> int:
        return self.local.kv_bytes_per_block(block_size)

    def create_kv_cache(self, num_blocks: int, block_size: int,
                        limits: KVStepLimits | None = None) -> KVManager:
        return create_kv_cache_of(self.local, num_blocks, block_size, limits)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        self.group.broadcast(batch.input_ids)  # rank 0's ids (TensorParallelModel._forward)
        return self.local.forward(batch)

    def forward_hidden(self, batch: ForwardBatch) -> torch.Tensor:
        local = self.local
        if not supports_pooling(local):
            raise RuntimeError("rank 0 asked for hidden states of a shard without "
                               "SupportsPooling")
        self.group.broadcast(batch.input_ids)
        return local.forward_hidden(batch)


@torch.inference_mode()
def _serve(model: RankModel, batches: zmq.Socket[bytes],
           conn: multiprocessing.connection.Connection) -> None:
    graphs: CudaGraphRunner | None = None
    while True:  # rank 0 gone: `_exit_when_orphaned` ends the process
        message = pickle.loads(batches.recv())
        kind = message[0]
        if kind == "forward":
            host: HostBatch = message[1]
            model.forward(host.to_device(model.device))
        elif kind == "forward_hidden":  # a step of pooling requests (SupportsPooling)
            model.forward_hidden(message[1].to_device(model.device))
        elif kind == "replay":
            assert graphs is not None, "rank 0 replays a graph never captured here"
            graphs.replay(message[1], message[2])
        elif kind == "capture":
            plan: GraphPlan = message[1]
            if graphs is None:
                graphs = CudaGraphRunner(model, plan.max_batch, plan.max_blocks_per_seq,
                                         plan.mixed_max_tokens, plan.kv_groups)
            graphs.capture_keys(message[2], message[3])
        elif kind == "started":  # start-up is done: a compile from now on is a late one
            if model.device.type == "cuda":
                log_late_compiles()
        elif kind == "kv":
            model.create_kv_cache(message[1], message[2], message[3])
            conn.send(("kv", None))
        elif kind == "stop":
            if graphs is not None:  # before the group is left (CudaGraphRunner.release)
                graphs.release()
            return
        else:
            raise RuntimeError(f"unknown message from rank 0: {kind!r}")


def _exit_when_orphaned(parent: int) -> None:
    """End this process once rank 0's is gone: the main thread may wait forever in a
    collective inside a CUDA graph, which no timeout ends."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_S)
    log.error("rank 0 died: ending this rank; where its threads were:")
    faulthandler.dump_traceback(all_threads=True)
    os._exit(1)
