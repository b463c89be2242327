"""`ReplicaRouter`: one `EngineHandle` over the engine clients of data-parallel replicas
(`openinfer serve --data-parallel-size N`), so that the server above it keeps its shape.

Each new request goes to one replica, chosen in `route`:

    live    = the replicas whose engine is alive
    least   = the live replica with the fewest requests (ties taken in turn)
    holder  = the live replica that served the longest whole-block prefix of the prompt lately
              (of several, the least loaded)
    holder, unless its load is both BALANCE_ABS more than least's and BALANCE_REL times it;
    then (or without a holder) least

The prefix table (ipc/affinity.py) is the router's own with one frontend; with several
(`--api-server-count`) the launcher shares one among them (`SharedAffinity`), so that a
conversation's turns find the same replica whichever frontend each reaches.

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
from openinfer_core.ipc.affinity import MAX_REPLICAS, PrefixAffinity, block_keys
from openinfer_core.request import GenerateRequest

log = logging.getLogger("openinfer")

# When the replica holding a prompt's prefix is too busy to get it: its load must pass the
# least loaded one's by both BALANCE_ABS requests and BALANCE_REL times (the form of SGLang's
# cache-aware router). A prefix hit saves the matched tokens' whole prefill and a second copy of
# their KV, while a few more sequences in a batch of hundreds cost little (a decode step reads
# the weights once for the whole batch): 32 is a few percent of a replica's 256-512 sequences.
# The ratio keeps a busy server on its prefixes (300 against 250 stays), while an idle replica
# still takes work from a loaded one (40 against 5 moves); 1.5 bounds how lopsided affinity can
# make the replicas, so one long conversation cannot pile every request onto one replica.
BALANCE_ABS = 32
BALANCE_REL = 1.5
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
    prefix table is not locked: see ipc/affinity.py); `load`, `replica_loads` and `dead` from
    any thread."""

    def __init__(self, replicas: Sequence[Replica],
                 affinity: PrefixAffinity | None = None) -> None:
        """`affinity`: a prefix table shared with other frontends' routers (the caller closes
        it); by default this router's own, sized for the blocks every replica can cache."""
        if not 2 <= len(replicas) <= MAX_REPLICAS:
            raise ValueError(f"a router needs 2 to {MAX_REPLICAS} replicas, got {len(replicas)}")
        self.replicas = list(replicas)
        if affinity is None:
            affinity = PrefixAffinity.in_process(sum(r.model_info.kv_total_blocks
                                                     for r in replicas))
        self._affinity = affinity
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
        by_load = sorted(live, key=lambda i: (loads[i], (i - turn) % count))
        least = by_load[0]
        keys = block_keys(prompt_token_ids, self._block_size)
        holder, _ = self._affinity.match(keys, by_load)
        chosen = least
        if holder is not None and not too_busy(loads[holder], loads[least]):
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


def too_busy(holder_load: int, least_load: int) -> bool:
    """Whether the replica holding a prompt's prefix should give the request up to the least
    loaded one (see BALANCE_ABS)."""
    return holder_load > least_load + BALANCE_ABS and holder_load > BALANCE_REL * least_load


def _log_death(index: int, message: str) -> None:
    log.error("data-parallel replica %d: %s; no new request goes to it", index, message)
