"""`ReplicaRouter`: one `EngineHandle` over the engine clients of data-parallel replicas
(`openinfer serve --data-parallel-size N`), so that the server above it keeps its shape.

Each new request goes to one replica, chosen in `route`:

    live    = the replicas whose engine is alive
    least   = the live replica with the fewest requests (ties to the one whose engine counted
              fewer at its latest step, then taken in turn)
    holder  = the live replica that served the longest whole-block prefix of the prompt lately
              (of several, the least loaded)
    holder, unless its load is both BALANCE_ABS more than least's and BALANCE_REL times it;
    then (or without a holder) least

The prefix table (ipc/affinity.py) is the router's own with one frontend; with several
(`--api-server-count`) the launcher shares one among them (`SharedAffinity`), so that a
conversation's turns find the same replica whichever frontend each reaches.

A replica's load is this router's requests on it: routed there and not yet ended (their
streams finished, closed or dropped). Every frontend balances its own share, so the replicas'
totals stay within a few requests of each other whatever the number of frontends (prefix
affinity aside, which each frontend may skew by its own BALANCE_ABS and BALANCE_REL), and a
burst is spread as it arrives. The engines' own counts (running + waiting, other frontends'
included) arrive a step late: in a burst of a thousand requests reaching four frontends at
once they held one replica at 512 running and 141 waiting while the other had 141 free slots
for seconds (`gpu_check.sh dp`, 2 x H200). A slow replica keeps its requests longer, so it
gets fewer. The affinity thresholds below apply to these per-frontend counts. Ties (common
when few requests are in) go to the replica whose engine counted fewer running + waiting at
its latest step: that count includes the other frontends' requests, so two requests reaching
two frontends one after the other still land on different replicas.

Aborts go to the replica holding the request. A dead replica fails its own requests (its
client does that) and gets no new ones; the router then reports itself dead, so the server
answers /health with 503 and stops, as it does when its one engine dies."""

from __future__ import annotations

import dataclasses
import functools
import logging
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


class Replica(EngineHandle, Protocol):
    """What the router needs of a replica's handle beyond `EngineHandle` (`EngineClient`)."""

    def holds(self, request_id: str) -> bool:
        """Whether `request_id` was sent through this handle and has not ended."""
        ...

    def on_death(self, callback: Callable[[str], None]) -> None:
        """Call `callback(message)` (on any thread) if the replica's engine dies."""
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
        self.open = [0] * len(replicas)  # this router's requests on each: routed, not ended
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
        index = self.route(request.prompt_token_ids)
        return _Counted(self.open, index, self.replicas[index].generate(request))

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
        if not live:  # its client ends the request with the engine's error at once
            self.open[0] += 1  # (and its stream gives the count back)
            return 0
        loads = {i: self.open[i] for i in live}
        count, turn = len(self.replicas), self._turn
        self._turn = (turn + 1) % count
        engines = {i: self._engine_count(i) for i in live}
        by_load = sorted(live, key=lambda i: (loads[i], engines[i], (i - turn) % count))
        least = by_load[0]
        keys = block_keys(prompt_token_ids, self._block_size)
        holder, _ = self._affinity.match(keys, by_load)
        chosen = least
        if holder is not None and not too_busy(loads[holder], loads[least]):
            chosen = holder
        self._affinity.record(keys, chosen)
        self.open[chosen] += 1  # until its stream ends (`_Counted`)
        return chosen

    def _engine_count(self, index: int) -> int:
        load = self.replicas[index].load()
        return load.running + load.waiting


class _Counted:
    """A replica's event stream that takes its request off the router's count (`open`) once,
    when it ends: finished, failed, closed, or dropped without ever being read (a client
    gone before its request was sent)."""

    def __init__(self, open_counts: list[int], index: int,
                 events: AsyncIterator[TokenEvent]) -> None:
        self._open, self._index, self._events = open_counts, index, events
        self._counted = True

    def __aiter__(self) -> _Counted:
        return self

    async def __anext__(self) -> TokenEvent:
        try:
            return await anext(self._events)
        except Exception:  # the end (StopAsyncIteration) or a failure; a cancelled reader
            self._end()    # closes or drops the stream
            raise

    async def aclose(self) -> None:
        self._end()
        close = getattr(self._events, "aclose", None)
        if close is not None:
            await close()

    def __del__(self) -> None:
        # Dropped without an end (the server closes every stream it opens, so this is the
        # rare path): on the loop's thread when the last reference goes, as it does there.
        self._end()

    def _end(self) -> None:
        if self._counted:
            self._counted = False
            self._open[self._index] -= 1


def too_busy(holder_load: int, least_load: int) -> bool:
    """Whether the replica holding a prompt's prefix should give the request up to the least
    loaded one (see BALANCE_ABS)."""
    return holder_load > least_load + BALANCE_ABS and holder_load > BALANCE_REL * least_load


def _log_death(index: int, message: str) -> None:
    log.error("data-parallel replica %d: %s; no new request goes to it", index, message)
