"""`ReplicaRouter` over scripted replicas: least-loaded routing (the engine's count plus this
router's requests still on their way to it) with ties taken in turn, prefix affinity until the
holder is too busy (BALANCE_ABS and BALANCE_REL), a prefix table shared by two frontends'
routers, dead replicas skipped, aborts to the holder, summed load. The table itself:
test_affinity.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from openinfer_core.events import TokenEvent
from openinfer_core.handle import LoadSnapshot, ModelInfo, supports_replica_loads
from openinfer_core.interfaces.kv import PrefixCacheStats
from openinfer_core.ipc import router as router_module
from openinfer_core.ipc.affinity import SharedAffinity
from openinfer_core.ipc.router import BALANCE_ABS, ReplicaRouter, too_busy
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


def test_a_conversation_follows_its_prefix_until_its_replica_is_too_busy() -> None:
    router, _ = _router()
    turn1 = list(range(100, 118))
    first = router.route(turn1)
    turn2 = [*turn1, 7, 8, 9, 10, 11]
    other = 1 - first
    _busy(router, first, BALANCE_ABS)  # busier, but not by more than BALANCE_ABS
    assert router.route(turn2) == first
    _busy(router, first, BALANCE_ABS + 1)
    assert router.route([*turn2, 12]) == other  # past both thresholds: the least loaded
    _busy(router, other, 5)  # both hold the prefix now: the less loaded of them
    assert router.route([*turn2, 12, 13]) == other
    assert router.route(list(range(300, 320))) == other  # no match: the least loaded


def test_of_several_holders_the_least_loaded_and_the_deepest_first() -> None:
    router, _ = _router(3)
    shared = list(range(8))  # two blocks every conversation starts with
    _busy(router, 0, 3)
    _busy(router, 1, 1)
    _busy(router, 2, 2)
    assert router.route([*shared, 50, 51, 52, 53]) == 1
    _busy(router, 1, 40)
    assert router.route([*shared, 60, 61, 62, 63]) == 2  # 1 is too busy: the least loaded
    _busy(router, 1, 9)
    _busy(router, 2, 7)
    assert router.route([*shared, 70, 71, 72, 73]) == 2  # holders 1 and 2: the less loaded
    assert router.route([*shared, 50, 51, 52, 53, 54]) == 1  # the deeper prefix wins


@pytest.mark.parametrize(("holder", "least", "moves"), [
    (BALANCE_ABS, 0, False), (BALANCE_ABS + 1, 0, True),  # idle least: the gap alone
    (48, 16, False), (49, 16, True),  # both thresholds at once
    (300, 250, False), (400, 250, True),  # busy: the ratio keeps the prefix
    (100, 67, False), (101, 67, True),
])
def test_the_balance_rule(holder: int, least: int, moves: bool) -> None:
    assert too_busy(holder, least) is moves
    router, _ = _router()
    prompt = list(range(40))
    first = router.route(prompt)
    _busy(router, first, holder)
    _busy(router, 1 - first, least)
    assert router.route(prompt) == (1 - first if moves else first)


def test_a_second_turn_at_another_frontend_finds_the_first_turns_replica() -> None:
    """Two frontends' routers over one shared table: the second turn reaches the router that
    never saw the first and still goes where the first went, where with tables of their own
    it would go to the less loaded replica."""
    owner = SharedAffinity.create(100)
    other_frontend = SharedAffinity.attach(owner.name)
    try:
        for shared in (True, False):
            table_b = other_frontend.table if shared else None
            a = ReplicaRouter([FakeReplica(), FakeReplica()], owner.table)
            b = ReplicaRouter([FakeReplica(), FakeReplica()], table_b)
            turn1 = [1000 + i for i in range(4 * BLOCK + 2)]
            first = a.route(turn1)
            _busy(b, first, 8)  # at b the first turn's replica is the busier one
            assert b.route([*turn1, 5, 6, 7]) == (first if shared else 1 - first)
    finally:
        other_frontend.close()
        owner.close()


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
    with pytest.raises(ValueError, match="2 to 16 replicas"):
        ReplicaRouter([FakeReplica()])
