"""`ReplicaRouter`: one `EngineHandle` over the engine clients of data-parallel replicas
(`openinfer serve --data-parallel-size N`), so that the server above it keeps its shape.

Each new request goes to one replica, chosen in `route`:

    live    = the replicas whose engine is alive
    least   = the live replica with the fewest requests (ties taken in turn)
    holder  = the live replica that last served the longest whole-block prefix of the prompt
    holder if its load is within AFFINITY_MARGIN of least's, else least

A replica's load is the engine's running + waiting count from its latest step (other
frontends' requests included), plus this router's requests still on their way to it: routed
here (counted at once) minus those the engine had taken in by that step (it says how many).
Both counts only grow, so a step's count arriving while requests are in flight cannot hide
them (a burst would otherwise all see the same counts and pile onto one replica). A request
routed but never sent (its client gone first) would count for ever: when the engine and this
router's client of it are both idle, the count restarts from the engine's.

Aborts go to the replica holding the request. A dead replica fails its own requests (its
client does that) and gets no new ones; the router then reports itself dead, so the server
answers /health with 503 and stops, as it does when its one engine dies."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from openinfer_core.events import TokenEvent
from openinfer_core.handle import EngineHandle, LoadSnapshot, ModelInfo
from openinfer_core.interfaces.kv import PrefixCacheStats
from openinfer_core.ipc.affinity import PrefixAffinity, block_keys
from openinfer_core.request import GenerateRequest

log = logging.getLogger("openinfer")

# How many more requests the replica holding a prompt's prefix may carry than the least loaded
# one and still get it. A prefix hit saves the matched tokens' whole prefill and a second copy
# of their KV; a few more requests in a replica's batch cost little (a decode step reads the
# weights once for the whole batch). Past the margin the balance wins: a long conversation
# cannot pile every request onto one replica.
AFFINITY_MARGIN = 16
# How long after its last request a replica's count may restart (see the module docstring):
# a request routed is sent once its handler first awaits its stream, well within a second.
SETTLE_S = 1.0


class Replica(EngineHandle, Protocol):
    """What the router needs of a replica's handle beyond `EngineHandle` (`EngineClient`)."""

    def holds(self, request_id: str) -> bool:
        """Whether `request_id` was sent through this handle and has not ended."""
        ...

    def on_death(self, callback: Callable[[str], None]) -> None:
        """Call `callback(message)` (on any thread) if the replica's engine dies."""
        ...

    def received(self) -> int:
        """How many of the requests sent through this handle the engine had taken in at its
        latest step."""
        ...

    def open_requests(self) -> int:
        """Requests sent through this handle that have started and not ended."""
        ...


class ReplicaRouter:
    """Implements `openinfer_core.handle.EngineHandle` and `SupportsReplicaLoads` over two or
    more replicas of one model. `generate` and `abort` run on the server's event loop (the
    prefix map is not locked); `load`, `replica_loads` and `dead` from any thread."""

    def __init__(self, replicas: Sequence[Replica]) -> None:
        if len(replicas) < 2:
            raise ValueError(f"a router needs 2 or more replicas, got {len(replicas)}")
        self.replicas = list(replicas)
        # Bounded by the blocks every replica can cache: a block older than that has most
        # likely left every prefix cache already.
        self._affinity = PrefixAffinity(sum(r.model_info.kv_total_blocks for r in replicas))
        self._block_size = replicas[0].model_info.kv_block_size
        self._turn = 0  # the replica ties start from, moved on each request
        self.routed = [0] * len(replicas)  # requests this router sent each replica, ever
        self._last_route = [0.0] * len(replicas)  # time.monotonic() of each one's latest
        for i, replica in enumerate(replicas):
            replica.on_death(functools.partial(_log_death, i))

    # -- EngineHandle ----------------------------------------------------------------------
    @property
    def model_info(self) -> ModelInfo:
        """Replica 0's, with the shortest `max_model_len` of any: every replica serves the
        same model, but each may have lowered the length to fit its own KV cache."""
        info = self.replicas[0].model_info
        shortest = min(r.model_info.max_model_len for r in self.replicas)
        return dataclasses.replace(info, max_model_len=shortest)

    @property
    def dead(self) -> str | None:
        """The first dead replica's reason: one dead replica stops the server."""
        return next((r.dead for r in self.replicas if r.dead is not None), None)

    def load(self) -> LoadSnapshot:
        """Every replica's load summed (offload stats are per replica: `replica_loads`)."""
        loads = self.replica_loads()
        return LoadSnapshot(
            running=sum(s.running for s in loads), waiting=sum(s.waiting for s in loads),
            kv_used_blocks=sum(s.kv_used_blocks for s in loads),
            kv_total_blocks=sum(s.kv_total_blocks for s in loads),
            prefix_cache=PrefixCacheStats(sum(s.prefix_cache.queries for s in loads),
                                          sum(s.prefix_cache.hits for s in loads)),
            num_preemptions=sum(s.num_preemptions for s in loads))

    def generate(self, request: GenerateRequest) -> AsyncIterator[TokenEvent]:
        return self.replicas[self.route(request.prompt_token_ids)].generate(request)

    def abort(self, request_id: str) -> None:
        for replica in self.replicas:
            if replica.holds(request_id):
                replica.abort(request_id)
                return

    # -- SupportsReplicaLoads --------------------------------------------------------------
    def replica_loads(self) -> list[LoadSnapshot]:
        return [r.load() for r in self.replicas]

    # -- routing ---------------------------------------------------------------------------
    def route(self, prompt_token_ids: Sequence[int]) -> int:
        """The replica for a new request with this prompt; remembers the choice for the
        prompt's blocks."""
        live = [i for i, r in enumerate(self.replicas) if r.dead is None]
        if not live:
            return 0  # its client ends the request with the engine's error at once
        loads = {i: self._load_of(i) for i in live}
        count, turn = len(self.replicas), self._turn
        self._turn = (turn + 1) % count
        least = min(live, key=lambda i: (loads[i], (i - turn) % count))
        keys = block_keys(prompt_token_ids, self._block_size)
        holder, _ = self._affinity.match(keys, live)
        chosen = least
        if holder is not None and loads[holder] <= loads[least] + AFFINITY_MARGIN:
            chosen = holder
        self._affinity.record(keys, chosen)
        self.routed[chosen] += 1
        self._last_route[chosen] = time.monotonic()
        return chosen

    def _load_of(self, index: int) -> int:
        replica = self.replicas[index]
        snapshot = replica.load()
        received = replica.received()
        if (snapshot.running + snapshot.waiting == 0 and replica.open_requests() == 0
                and time.monotonic() - self._last_route[index] > SETTLE_S):
            self.routed[index] = received  # idle: nothing of ours is on its way
        return snapshot.running + snapshot.waiting + max(0, self.routed[index] - received)


def _log_death(index: int, message: str) -> None:
    log.error("data-parallel replica %d: %s; no new request goes to it", index, message)
