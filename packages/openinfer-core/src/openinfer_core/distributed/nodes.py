"""Tensor parallelism over several nodes, through torch.distributed's own rendezvous: a TCP
store that rank 0 hosts at `--master-addr:--master-port` (torchrun's MASTER_ADDR /
MASTER_PORT), `--nnodes` nodes of `size / nnodes` ranks each.

Node 0 runs the engine (rank 0, the API) and its other local ranks, as on one host. Every other
node runs `openinfer serve ... --node-rank N`, which serves nothing: it reads the workers'
spec from the store (what rank 0 loads, so the nodes cannot disagree), spawns its local ranks,
relays what they say (`ready`, `kv`, `error`) into the store, and beats a heartbeat there.
Rank 0 sees a remote rank as a `RemoteRank`: the same waits, bounded, and a node whose
heartbeat stops is dead. A node whose store goes away (rank 0 died) stops its ranks and exits
non-zero. The batch header goes over ZeroMQ on TCP (rank 0's XPUB), the tensors over the group.

    store keys: spec (the pickled WorkerSpec), rank{r}/{ready,kv,error}, node{n}/beat"""

from __future__ import annotations

import datetime
import logging
import os
import pickle
import time
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from openinfer_core.interfaces.model import ModelFailedError

log = logging.getLogger("openinfer")

BEAT_S = 0.5  # how often a node agent beats
DEAD_AFTER_S = 10.0  # a node whose heartbeat has not moved for this long is dead
POLL_S = 0.05  # how often rank 0 looks for a remote rank's answer


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """Where this process sits among the nodes (`--nnodes`, `--node-rank`, `--master-addr`,
    `--master-port`). One node: the rest is unused."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    def ranks_per_node(self, size: int) -> int:
        return size // self.nnodes

    def local_ranks(self, size: int) -> range:
        """The global ranks this node runs."""
        per = self.ranks_per_node(size)
        return range(self.node_rank * per, (self.node_rank + 1) * per)


def open_store(layout: NodeLayout, timeout_s: float, *, host: bool) -> dist.Store:
    """Our keys in the TCP store at the master's address. Rank 0's process hosts it (`host`)
    unless torchrun's agent already does there (TORCHELASTIC_USE_AGENT_STORE, as
    torch.distributed's env:// does); every other process connects, retrying until it is up or
    `timeout_s` passes."""
    host = host and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    raw = dist.TCPStore(layout.master_addr, layout.master_port, None, host,
                        timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    return dist.PrefixStore("openinfer/", raw)


def group_store(store: dist.Store) -> dist.Store:
    """The keys the process group uses, apart from ours."""
    return dist.PrefixStore("group/", store)


def publish(store: dist.Store, key: str, value: Any) -> None:
    # Store.set takes bytes too (its stub says str).
    store.set(key, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))  # type: ignore[arg-type]


def read(store: dist.Store, key: str) -> Any:
    return pickle.loads(store.get(key))


class RemoteRank:
    """Rank 0's view of a rank another node runs: the interface of a local worker (wait for
    its next answer, alive, why it ended), through the store."""

    def __init__(self, rank: int, node: int, store: dist.Store) -> None:
        self.rank = rank
        self.node = node
        self._store = store
        self._beat = -1
        self._beat_seen = time.monotonic()
        self._beat_checked = 0.0

    def wait_for(self, kind: str, deadline: float) -> Any:
        """The payload this rank sent as `kind`; `ModelFailedError` when it reports an error,
        its node stops beating, or `deadline` passes."""
        key = f"rank{self.rank}/{kind}"
        while True:
            if self._store.check([f"rank{self.rank}/error"]):
                raise ModelFailedError(self.describe_exit() or f"rank {self.rank} failed")
            if self._store.check([key]):
                return read(self._store, key)
            if not self.alive():
                raise ModelFailedError(self.describe_exit() or f"rank {self.rank} died")
            if time.monotonic() > deadline:
                raise ModelFailedError(f"tensor-parallel rank {self.rank} (node {self.node}) did "
                                       f"not answer {kind!r} in time")
            time.sleep(POLL_S)

    def alive(self) -> bool:
        """Whether its node beat within `DEAD_AFTER_S` (asked of the store at most every
        `BEAT_S`) and it reported no error."""
        now = time.monotonic()
        if now - self._beat_checked >= BEAT_S:
            self._beat_checked = now
            try:
                beat = self._store.add(f"node{self.node}/beat", 0)
                failed = self._store.check([f"rank{self.rank}/error"])
            except Exception:  # the store is ours: failing to reach it means we are going
                return False
            if failed:
                return False
            if beat != self._beat:
                self._beat, self._beat_seen = beat, now
        return now - self._beat_seen < DEAD_AFTER_S

    def describe_exit(self) -> str | None:
        """Why this rank is gone (None while it runs)."""
        where = f"tensor-parallel rank {self.rank} (node {self.node})"
        try:
            if self._store.check([f"rank{self.rank}/error"]):
                return f"{where} failed:\n{read(self._store, f'rank{self.rank}/error')}"
        except Exception:
            pass
        if time.monotonic() - self._beat_seen >= DEAD_AFTER_S:
            return f"{where} stopped answering: its node's heartbeat stopped"
        return None
