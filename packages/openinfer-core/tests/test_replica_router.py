"""`ReplicaRouter` over scripted replicas: least-loaded routing (this router's requests on each
replica, routed and not ended) with ties taken in turn, prefix affinity until the
holder is too busy (BALANCE_ABS and BALANCE_REL), a prefix table shared by two frontends'
routers, dead replicas skipped, aborts to the holder, summed load. The table itself:
test_affinity.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from openinfer_core.events import Token, TokenEvent
from openinfer_core.handle import LoadSnapshot, ModelInfo, supports_replica_loads
from openinfer_core.interfaces.kv import PrefixCacheStats
from openinfer_core.ipc.affinity import SharedAffinity
from openinfer_core.ipc.router import BALANCE_ABS, ReplicaRouter, too_busy
from openinfer_core.params import SamplingParams
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

    def load(self) -> LoadSnapshot:
        return self.snapshot

    def holds(self, request_id: str) -> bool:
        return request_id in self.requests

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def on_death(self, callback: Callable[[str], None]) -> None:
        self.callbacks.append(callback)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenEvent]:
        self.requests.add(request.request_id)
        yield Token(request.request_id, 1)


def _router(count: int = 2) -> tuple[ReplicaRouter, list[FakeReplica]]:
    replicas = [FakeReplica() for _ in range(count)]
    return ReplicaRouter(replicas), replicas


def _busy(router: ReplicaRouter, index: int, requests: int) -> None:
    """This router holding `requests` open on replica `index`."""
    router.open[index] = requests


def test_least_loaded_wins_ties_taken_in_turn() -> None:
    router, _ = _router(3)
    _busy(router, 2, 2)
    # Each route counts at once (loads 0 0 2, 1 0 2, 1 1 2, 2 1 2).
    assert [router.route([i]) for i in range(4)] == [0, 1, 0, 1]
    _busy(router, 0, 0)  # replica 0's requests ended
    assert router.route([9]) == 0
    _busy(router, 0, 5)
    _busy(router, 1, 4)
    assert router.route([9]) == 2
    _busy(router, 2, 1)
    assert [router.route([i]) for i in range(4)] == [2, 2, 2, 1]  # 1 2 3 then 4 4: in turn


def test_ties_go_to_the_replica_whose_engine_counted_fewer() -> None:
    """Equal counts here (another frontend's request is not among them): the engines' own
    counts, which include it, break the tie; equal there too, in turn."""
    router, replicas = _router(3)
    replicas[0].snapshot = LoadSnapshot(1, 0, 0, 50)  # another frontend's request
    replicas[1].snapshot = LoadSnapshot(0, 2, 0, 50)
    assert router.route([1]) == 2
    assert router.route([2]) == 0  # own counts 0 0 1: the fewest first, whatever the engines
    _busy(router, 0, 0)
    _busy(router, 2, 0)
    for replica in replicas:
        replica.snapshot = LoadSnapshot(0, 0, 0, 50)
    assert [router.route([i]) for i in range(3)] == [2, 0, 1]  # in turn, from the third


def _request(i: int, prompt: list[int] | None = None) -> GenerateRequest:
    return GenerateRequest(f"r{i}", tuple(prompt or [i]), SamplingParams(max_tokens=1))


def test_a_request_counts_from_its_route_until_its_stream_ends() -> None:
    """A burst is spread as it is routed, before any stream is read; a stream read to its
    end, closed, or dropped unread (its client gone first) gives its count back once."""
    router, _ = _router()
    streams = [router.generate(_request(i)) for i in range(6)]
    assert router.open == [3, 3]

    async def read_close_drop() -> None:
        assert [event async for event in streams[0]] == [Token("r0", 1)]
        assert router.open == [2, 3]
        await streams[1].aclose()
        await streams[1].aclose()  # once only
        assert router.open == [2, 2]

    asyncio.run(read_close_drop())
    del streams[2]  # dropped unread
    assert router.open == [1, 2]
    assert [router.route([9]), router.route([9])] == [0, 1]


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


def test_with_every_replica_dead_a_stream_still_gives_its_count_back() -> None:
    router, replicas = _router()
    for replica in replicas:
        replica.dead = "the engine process died"
    stream = router.generate(_request(1))
    assert router.open == [1, 0]
    del stream
    assert router.open == [0, 0]
