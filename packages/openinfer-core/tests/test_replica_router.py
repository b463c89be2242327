"""`ReplicaRouter` over scripted replicas: least-loaded routing (the engine's count plus this
router's requests still on their way to it) with ties taken in turn, prefix affinity within
AFFINITY_MARGIN, dead replicas skipped, aborts to the holder, summed load; and the block keys
and the bounded prefix map it routes by."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from openinfer_core.events import TokenEvent
from openinfer_core.handle import LoadSnapshot, ModelInfo, supports_replica_loads
from openinfer_core.interfaces.kv import PrefixCacheStats
from openinfer_core.ipc import router as router_module
from openinfer_core.ipc.affinity import PrefixAffinity, block_keys
from openinfer_core.ipc.router import AFFINITY_MARGIN, ReplicaRouter
from openinfer_core.request import GenerateRequest

BLOCK = 4


class FakeReplica:
    """A replica handle whose load, requests and death the test sets."""

    def __init__(self, blocks: int = 50) -> None:
        self.model_info = ModelInfo("m", 64, blocks, BLOCK, (0,))
        self.snapshot = LoadSnapshot(0, 0, 0, blocks)
        self.requests: set[str] = set()
        self.aborted: list[str] = []
        self.dead: str | None = None
        self.callbacks: list[Callable[[str], None]] = []
        self.taken = 0  # this router's requests the engine took in, at its latest step
        self.open = 1  # requests started through this handle and not ended

    def load(self) -> LoadSnapshot:
        return self.snapshot

    def holds(self, request_id: str) -> bool:
        return request_id in self.requests

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def on_death(self, callback: Callable[[str], None]) -> None:
        self.callbacks.append(callback)

    def received(self) -> int:
        return self.taken

    def open_requests(self) -> int:
        return self.open

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenEvent]:
        self.requests.add(request.request_id)
        return
        yield


def _router(count: int = 2) -> tuple[ReplicaRouter, list[FakeReplica]]:
    replicas = [FakeReplica() for _ in range(count)]
    return ReplicaRouter(replicas), replicas


def _busy(router: ReplicaRouter, index: int, running: int, waiting: int = 0,
          taken: int | None = None) -> None:
    """A step's load from replica `index`'s engine: `running` and `waiting` requests, having
    taken in `taken` of this router's (default: all it was sent)."""
    replica = router.replicas[index]
    assert isinstance(replica, FakeReplica)
    replica.snapshot = LoadSnapshot(running, waiting, 0, replica.snapshot.kv_total_blocks)
    replica.taken = router.routed[index] if taken is None else taken


def test_block_keys_chain_whole_blocks() -> None:
    ids = list(range(11))
    keys = block_keys(ids, BLOCK)
    assert len(keys) == 2  # the partial third block gets none
    assert block_keys(ids[:8], BLOCK) == keys
    assert block_keys([*ids[:4], 99, *ids[5:]], BLOCK)[1] != keys[1]  # a key stands for its prefix
    assert block_keys(ids[4:8], BLOCK) != keys[1:2]  # the same block after another parent
    assert block_keys(ids[:3], BLOCK) == []


def test_prefix_map_matches_the_longest_prefix_and_drops_tails_first() -> None:
    affinity = PrefixAffinity(capacity=4)
    a, b = block_keys(range(12), BLOCK), block_keys([*range(8), 50, 51, 52, 53], BLOCK)
    affinity.record(a, 0)
    affinity.record(b, 1)  # shares two blocks with a, now last served by 1
    assert affinity.match(a, {0, 1}) == (0, 3)
    assert affinity.match(b, {0, 1}) == (1, 3)
    assert affinity.match(a, {0}) == (0, 3)  # replica 1 dead: 0 still holds a's third block
    assert affinity.match(b, {0}) == (None, 0)
    affinity.record(block_keys([7] * 4, BLOCK), 0)  # a fifth key: the oldest goes
    assert len(affinity) == 4
    assert affinity.match(a, {0, 1}) == (1, 2)  # a's tail went; the shared root stayed
    assert affinity.match(b, {0, 1}) == (1, 3)
    affinity.record(block_keys([8] * 16, BLOCK), 2)
    assert affinity.match(b, {0, 1}) == (None, 0)


def test_least_loaded_wins_ties_taken_in_turn() -> None:
    router, _ = _router(3)
    _busy(router, 2, 2)
    # Between two steps: what is on its way counts (loads 0 0 2, 1 0 2, 1 1 2, 2 1 2).
    assert [router.route([i]) for i in range(4)] == [0, 1, 0, 1]
    _busy(router, 0, 0)  # replica 0's engine stepped: its requests are done
    assert router.route([9]) == 0
    _busy(router, 0, 3, 2)  # the engine knows of 5 (other frontends' included)
    _busy(router, 1, 4)
    assert router.route([9]) == 2
    _busy(router, 2, 1)
    assert [router.route([i]) for i in range(4)] == [2, 2, 2, 1]  # 1 2 3 then 4 4: in turn


def test_requests_on_their_way_count_until_the_engine_takes_them_in() -> None:
    """A step's count that arrives while requests are still on their way to that engine does
    not hide them: a burst stays spread."""
    router, _ = _router()
    assert [router.route([i]) for i in range(10)] == [0, 1] * 5
    _busy(router, 0, 2, taken=2)  # replica 0 stepped having taken in 2 of its 5
    # replica 0: 2 in the engine + 3 on their way; replica 1: 5 on their way
    assert [router.route([i]) for i in range(4)] == [0, 1, 0, 1]
    _busy(router, 0, 7)  # all 7 taken in and running
    _busy(router, 1, 1, taken=1)  # 1 running, 6 still on their way
    assert [router.route([0]) for _ in range(2)] == [0, 1]  # 7 against 7: in turn


def test_an_idle_replica_forgets_requests_that_never_reached_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    router, replicas = _router()
    clock = [100.0]
    monkeypatch.setattr(router_module.time, "monotonic", lambda: clock[0])
    for i in range(4):
        router.route([i])  # 2 each, never sent (their clients went away first)
    _busy(router, 0, 0, taken=0)
    _busy(router, 1, 0, taken=0)
    replicas[0].open = replicas[1].open = 0
    # just routed: they may still be on their way, so they count
    assert router.route([5]) == 0  # 2 against 2
    clock[0] += router_module.SETTLE_S + 0.1
    # idle, nothing started there, nothing routed there for a while: the counts restart
    assert [router.route([i]) for i in range(3)] == [1, 0, 1]


def test_a_conversation_follows_its_prefix_within_the_margin() -> None:
    router, _ = _router()
    turn1 = list(range(100, 118))
    first = router.route(turn1)
    turn2 = [*turn1, 7, 8, 9, 10, 11]
    other = 1 - first
    _busy(router, first, AFFINITY_MARGIN)  # busier, but within the margin
    assert router.route(turn2) == first
    _busy(router, first, AFFINITY_MARGIN + 1)
    assert router.route([*turn2, 12]) == other  # past it: the least loaded
    assert router.route([*turn2, 12, 13]) == other  # and the prefix now follows there
    assert router.route(list(range(300, 320))) == other  # no match: the least loaded


def test_dead_replicas_get_nothing_and_the_router_reports_death() -> None:
    router, replicas = _router()
    prompt = list(range(16))
    holder = router.route(prompt)
    assert router.dead is None
    replicas[holder].dead = "the engine process died"
    assert {router.route(prompt) for _ in range(4)} == {1 - holder}
    assert router.dead == "the engine process died"
    replicas[1 - holder].dead = "the engine process died"
    assert router.route(prompt) == 0  # its client ends the request with the error


def test_abort_goes_to_the_holder_and_load_sums() -> None:
    router, replicas = _router()
    replicas[1].requests.add("r1")
    router.abort("r1")
    router.abort("unknown")
    assert (replicas[0].aborted, replicas[1].aborted) == ([], ["r1"])
    replicas[0].snapshot = LoadSnapshot(2, 1, 10, 50, PrefixCacheStats(40, 16), 1)
    replicas[1].snapshot = LoadSnapshot(3, 0, 5, 50, PrefixCacheStats(20, 0), 2)
    assert router.load() == LoadSnapshot(5, 1, 15, 100, PrefixCacheStats(60, 16), 3)
    assert supports_replica_loads(router)
    assert not supports_replica_loads(replicas[0])
    assert router.replica_loads() == [replicas[0].snapshot, replicas[1].snapshot]
    assert router.model_info == replicas[0].model_info


def test_generate_reaches_the_routed_replica() -> None:
    import asyncio

    from openinfer_core.params import SamplingParams

    router, replicas = _router()
    _busy(router, 0, 1)

    async def run() -> None:
        async for _ in router.generate(GenerateRequest("q", (1, 2, 3), SamplingParams())):
            pass

    asyncio.run(run())
    assert "q" in replicas[1].requests


def test_a_router_needs_two_replicas() -> None:
    with pytest.raises(ValueError, match="2 or more"):
        ReplicaRouter([FakeReplica()])
