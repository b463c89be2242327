"""The ranks a process spawns on its own node (`LocalRank`): start one, wait for its answers on
its pipe, say why it ended, stop them all. Rank 0 (`tp_model.py`) holds them beside the other
nodes' ranks (`nodes.RemoteRank`, the same interface); a node agent (`node_agent.py`) holds
its node's."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from typing import Any

import torch

from openinfer_core.distributed.nodes import RemoteRank
from openinfer_core.distributed.worker import WorkerSpec, run_worker
from openinfer_core.interfaces.model import ModelFailedError


class LocalRank:
    """A rank this process spawned (`worker.run_worker`) and the pipe it answers on: the
    interface `nodes.RemoteRank` gives another node's ranks."""

    def __init__(self, rank: int, process: BaseProcess,
                 conn: multiprocessing.connection.Connection) -> None:
        self.rank = rank
        self.process = process
        self.conn = conn
        self.error: str | None = None  # the traceback it sent before dying

    @classmethod
    def spawn(cls, spec: WorkerSpec) -> LocalRank:
        context = multiprocessing.get_context("spawn")
        conn, child_end = context.Pipe()
        process = context.Process(target=run_worker, args=(spec, child_end),
                                  name=f"openinfer-tp{spec.rank}", daemon=True)
        process.start()
        child_end.close()
        return cls(spec.rank, process, conn)

    def alive(self) -> bool:
        return self.process.is_alive()

    def wait_for(self, kind: str, deadline: float) -> Any:
        """The payload of this worker's next message, which must be `kind`; raises
        `ModelFailedError` when it dies, reports an error, or `deadline` passes."""
        while True:
            left = deadline - time.monotonic()
            ready = multiprocessing.connection.wait([self.conn, self.process.sentinel],
                                                    max(0.0, left))
            if self.conn in ready:
                try:
                    got, payload = self.conn.recv()
                except EOFError:
                    got, payload = "error", None
                if got == kind:
                    return payload
                if got == "error":
                    self.error = payload
                    self.process.join(5)
                    raise ModelFailedError(self.describe_exit() or f"rank {self.rank} failed")
            elif ready:  # the sentinel: dead without a word
                self.process.join(5)
                raise ModelFailedError(self.describe_exit() or f"rank {self.rank} died")
            elif left <= 0:
                raise ModelFailedError(f"tensor-parallel rank {self.rank} (pid "
                                       f"{self.process.pid}) did not answer {kind!r} in time")

    def describe_exit(self) -> str | None:
        """Why this worker is gone (None while it runs)."""
        if self.error is None and self.conn.poll():
            try:
                got, payload = self.conn.recv()
                self.error = payload if got == "error" else None
            except (EOFError, OSError):
                pass
        if self.process.is_alive() and self.error is None:
            return None
        what = (f"tensor-parallel rank {self.rank} (pid {self.process.pid}) exited with code "
                f"{self.process.exitcode}" if not self.process.is_alive()
                else f"tensor-parallel rank {self.rank} (pid {self.process.pid}) failed")
        return what if self.error is None else f"{what}:\n{self.error}"


def rank_device(device: torch.device, rank: int) -> str:
    """Rank r's device: the r-th GPU after rank 0's; the CPU for all on CPU."""
    if device.type == "cuda":
        return f"cuda:{(device.index or 0) + rank}"
    return str(device)


def local_ranks(workers: Sequence[LocalRank | RemoteRank]) -> list[LocalRank]:
    """The workers this process spawned (not the other nodes')."""
    return [w for w in workers if isinstance(w, LocalRank)]


def stop_ranks(workers: Sequence[LocalRank | RemoteRank], timeout: float) -> None:
    """Stop this process's workers (another node's agent stops its own)."""
    deadline = time.monotonic() + timeout
    for worker in local_ranks(workers):
        worker.process.join(max(0.0, deadline - time.monotonic()))
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(5)
        worker.conn.close()
