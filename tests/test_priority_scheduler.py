"""The `priority` scheduler (vLLM v1 semantics): admission by (priority, arrival), the exact
preemption victim, event order, unchanged greedy outputs, and how engines and the server
choose it. Scheduling tests use the toy counting model: after token t it predicts t + 1."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_helpers import run_staggered, tokens_of

from openinfer_core import (
    AsyncEngine,
    Engine,
    EngineConfig,
    Finished,
    GenerateRequest,
    Rejected,
    SamplingParams,
    Scheduled,
    TokenEvent,
)
from openinfer_core.engine.priority_scheduler import PriorityScheduler
from openinfer_core.engine.scheduler import FcfsScheduler
from openinfer_core.plugins import get_plugin_manager
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.app import build_app
from openinfer_server.cli import build_parser
from openinfer_server.serve import engine_config
from openinfer_toy.model import write_toy_checkpoint


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    return write_toy_checkpoint(tmp_path / "toy", vocab_size=1000, eos_token_id=999)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n)


def req(rid: str, prompt: tuple[int, ...], n: int, priority: int = 0,
        arrival: float = 0.0) -> GenerateRequest:
    return GenerateRequest(rid, prompt, greedy(n), arrival_time=arrival, priority=priority)


def toy_engine(toy: Path, scheduler: str, **kw: Any) -> Engine:
    return Engine(EngineConfig(model=str(toy), device="cpu", scheduler=scheduler, **kw))


def scheduled_order(engine: Engine) -> list[str]:
    order: list[str] = []
    while engine.has_work():
        order += [e.request_id for e in engine.step() if isinstance(e, Scheduled)]
    return order


def ids(seqs: Any) -> list[str]:
    return [s.request_id for s in seqs]


def test_the_priority_policy_is_built_in_and_chosen_by_name(toy: Path) -> None:
    regs = get_plugin_manager().registries
    assert regs.schedulers.get("priority").plugin == "core"
    assert type(toy_engine(toy, "priority").scheduler) is PriorityScheduler
    assert type(toy_engine(toy, "fcfs").scheduler) is FcfsScheduler


def test_admission_by_priority_then_arrival(toy: Path) -> None:
    engine = toy_engine(toy, "priority", max_num_seqs=1)
    for i, priority in enumerate([3, 1, 2, 1, 0]):
        engine.add_request(req(f"r{i}", (10 * i,), 2, priority, arrival=float(i)))
    assert scheduled_order(engine) == ["r4", "r1", "r3", "r2", "r0"]
    assert engine.kv.num_used_blocks == 0


def test_arrival_time_not_submission_order_breaks_ties(toy: Path) -> None:
    engine = toy_engine(toy, "priority", max_num_seqs=1)
    engine.add_request(req("late", (1,), 2, 0, arrival=5.0))
    engine.add_request(req("early", (2,), 2, 0, arrival=1.0))
    assert scheduled_order(engine) == ["early", "late"]


def test_a_better_arrival_waits_for_a_slot_instead_of_preempting(toy: Path) -> None:
    """vLLM v1: priority preempts only for the growth of running requests, never to admit.
    Step numbers are the plain loop's (overlapped, every event comes a step later)."""
    engine = toy_engine(toy, "priority", max_num_seqs=2, async_scheduling=False)
    engine.add_request(req("low0", (1,), 4, 9, 0.0))
    engine.add_request(req("low1", (2,), 6, 9, 1.0))
    at: dict[tuple[str, str], int] = {}
    for step in range(8):
        if step == 1:
            engine.add_request(req("high", (3,), 2, 0, 2.0))
        for e in engine.step():
            at[type(e).__name__, e.request_id] = step
    assert engine.scheduler.num_preemptions == 0  # type: ignore[attr-defined]
    assert at["Finished", "low0"] == 3 and at["Scheduled", "high"] == 4
    assert at["Finished", "high"] == 5 and at["Finished", "low1"] == 5


def _run_until_first_preemption(engine: Engine, arrivals: dict[int, list[GenerateRequest]],
                                max_steps: int = 50) -> tuple[int, list[str], list[str]]:
    """Steps (adding requests at their step) until a request is preempted; returns the step,
    the waiting ids and the running ids then."""
    for step in range(max_steps):
        for r in arrivals.get(step, []):
            engine.add_request(r)
        engine.step()
        if engine.scheduler.num_preemptions:  # type: ignore[attr-defined]
            sched = engine.scheduler
            return step, ids(sched.waiting), ids(sched.running)  # type: ignore[attr-defined]
    raise AssertionError("no preemption")


@pytest.mark.parametrize("scheduler, victim, used", [("priority", "A", 3), ("fcfs", "B", 2)])
def test_growth_preempts_the_worst_priority_not_the_newest(toy: Path, scheduler: str,
                                                           victim: str, used: int) -> None:
    """4 usable blocks of 4 tokens. A (1-token prompt) runs from step 0, B (6 tokens) from
    step 1; in step 4 A grows to 2 blocks, then B needs a third: the pool is full. fcfs
    preempts the newest (B itself); priority preempts A (worst priority), although A already
    had its row this step — the row is taken back and B runs."""
    engine = toy_engine(toy, scheduler, block_size=4, num_kv_blocks=5)
    prio = {"A": 5, "B": 0} if scheduler == "priority" else {"A": 0, "B": 0}
    a = req("A", (100,), 12, prio["A"], 0.0)
    b = req("B", tuple(range(200, 206)), 6, prio["B"], 1.0)
    step, waiting, running = _run_until_first_preemption(engine, {0: [a], 1: [b]})
    assert step == 4
    assert (waiting, running) == ([victim], [r for r in "AB" if r != victim])
    assert engine.kv.num_used_blocks == used  # the survivor's blocks; the victim holds none


def test_the_victim_is_the_latest_arrival_among_the_worst(toy: Path) -> None:
    """C and A share the worst priority; C arrived later (its arrival time) although it was
    submitted first, so C is the victim when A cannot grow in step 5 — not A (the newest of
    the two), not B — and C's row, already scheduled that step, is taken back."""
    engine = toy_engine(toy, "priority", block_size=4, num_kv_blocks=6)
    c = req("C", (100,), 15, 7, arrival=2.0)
    a = req("A", (300,), 15, 7, arrival=1.0)
    b = req("B", tuple(range(200, 206)), 10, 0, arrival=3.0)
    step, waiting, running = _run_until_first_preemption(engine, {0: [c], 1: [a], 2: [b]})
    assert (step, waiting, running) == (5, ["C"], ["A", "B"])


def _check_contract(events: list[TokenEvent]) -> None:
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "Scheduled" and kinds.count("Scheduled") == 1, kinds
    assert set(kinds[1:-1]) <= {"Token"}, kinds
    assert isinstance(events[-1], Finished), kinds


@pytest.mark.parametrize("scheduler", ["priority", "fcfs"])
def test_event_order_and_outputs_survive_preemption(toy: Path, scheduler: str) -> None:
    engine = toy_engine(toy, scheduler, block_size=4, num_kv_blocks=9,
                        max_num_batched_tokens=6)
    reqs = [req(f"r{i}", tuple(range(50 * i, 50 * i + 3 + i % 5)), 8 + i % 4,
                (i * 7) % 3 if scheduler == "priority" else 0, float(i)) for i in range(12)]
    events = run_staggered(engine, reqs, lambda i: i // 2)
    assert engine.scheduler.num_preemptions > 0  # type: ignore[attr-defined]
    for r in reqs:
        _check_contract(events[r.request_id])
        last = r.prompt_token_ids[-1]
        assert tokens_of(events[r.request_id]) == [last + k for k in range(1, r.max_tokens + 1)]
    assert engine.kv.num_used_blocks == 0


def test_greedy_outputs_unchanged_by_priority_and_preemption(qwen3_dir: Path) -> None:
    prompts = [tuple(range(100 + 7 * i, 100 + 7 * i + 20)) for i in range(4)]
    solo = Engine(EngineConfig(model=str(qwen3_dir), device="cpu"))
    alone = [tokens_of(run_staggered(solo, [req("x", p, 20)], lambda _: 0)["x"])
             for p in prompts]
    # 5 usable blocks of 16: two 20-token prompts fit, but not their growth to 40 tokens.
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", scheduler="priority",
                                 num_kv_blocks=6))
    reqs = [req(f"p{i}", p, 20, priority=[2, 0, 1, 0][i], arrival=float(i))
            for i, p in enumerate(prompts)]
    events = run_staggered(engine, reqs, lambda i: i)
    assert engine.scheduler.num_preemptions > 0  # type: ignore[attr-defined]
    for i in range(4):
        _check_contract(events[f"p{i}"])
        assert tokens_of(events[f"p{i}"]) == alone[i]
    assert engine.kv.num_used_blocks == 0


def test_fcfs_refuses_a_priority_it_cannot_honour(toy: Path) -> None:
    engine = toy_engine(toy, "fcfs")
    events = run_staggered(engine, [req("p", (1,), 2, priority=-1), req("z", (2,), 2)],
                           lambda _: 0)
    assert events["p"] == [Rejected("p", (
        "priority -1 needs priority scheduling, which is not enabled: start the server with "
        "--scheduler priority (EngineConfig(scheduler='priority'))"))]
    assert tokens_of(events["z"]) == [3, 4]


@pytest.mark.parametrize("flag", ["--scheduler", "--scheduling-policy"])
def test_server_flag_chooses_the_priority_scheduler(flag: str) -> None:
    parser = build_parser()
    args = parser.parse_args(["serve", "--device", "cpu", flag, "priority"])
    config = engine_config(args, parser, get_plugin_manager().registries)
    assert config.scheduler == "priority"


@pytest.fixture(scope="module")
def served(qwen3_dir: Path) -> Iterator[dict[str, tuple[AsyncEngine, Tokenizer]]]:
    tokenizer = Tokenizer.from_dir(qwen3_dir)
    engines = {name: AsyncEngine(Engine(EngineConfig(model=str(qwen3_dir), device="cpu",
                                                     scheduler=name)))
               for name in ("fcfs", "priority")}
    yield {name: (e, tokenizer) for name, e in engines.items()}
    for e in engines.values():
        e.shutdown()


def _post(engine: AsyncEngine, tokenizer: Tokenizer, path: str,
          body: dict[str, Any]) -> httpx.Response:
    app = build_app(engine, tokenizer, served_model_names=["m"])

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return await client.post(path, json=body, timeout=60)

    return asyncio.run(go())


CALLS = [("/v1/completions", {"prompt": "Hello", "max_tokens": 3}),
         ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 3})]


@pytest.mark.parametrize("path, body", CALLS)
def test_server_priority_field(served: dict[str, tuple[AsyncEngine, Tokenizer]], path: str,
                               body: dict[str, Any]) -> None:
    assert _post(*served["priority"], path, {**body, "priority": 5}).status_code == 200
    assert _post(*served["priority"], path, {**body, "priority": -3}).status_code == 200
    assert _post(*served["fcfs"], path, {**body, "priority": 0}).status_code == 200
    for stream in (False, True):
        r = _post(*served["fcfs"], path, {**body, "priority": 2, "stream": stream})
        assert r.status_code == 400
        assert "--scheduler priority" in r.json()["error"]["message"]
    for engine, _ in served.values():
        assert _idle(engine)


def _idle(engine: AsyncEngine) -> bool:
    for _ in range(200):
        load = engine.load()
        if load.running == load.waiting == load.kv_used_blocks == 0:
            return True
        time.sleep(0.02)
    return False

