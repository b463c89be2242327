"""A seeded random workload against a small KV pool, for each built-in scheduler: random
arrivals, prompt lengths (some sharing prefixes, some that can never fit), max_tokens,
priorities and aborts at every stage of a request's life. Every request must end with exactly
one terminal event in the contract order, the KV pool must drain, and the run must end within
a step cap. The toy counting model (after token t it predicts t + 1) keeps the run to engine
overhead and makes every output predictable."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from openinfer_core import (
    Engine,
    EngineConfig,
    Finished,
    FinishReason,
    GenerateRequest,
    Rejected,
    SamplingParams,
    Scheduled,
    Token,
    TokenEvent,
)
from openinfer_core.engine.request_state import RequestState
from openinfer_core.events import is_terminal
from openinfer_toy.model import write_toy_checkpoint

NUM_REQUESTS = 600
EOS = 999
BLOCK_SIZE = 4
NUM_KV_BLOCKS = 25  # 24 usable blocks = 96 tokens: a handful of requests at once
POOL_TOKENS = (NUM_KV_BLOCKS - 1) * BLOCK_SIZE
MAX_MODEL_LEN = POOL_TOKENS  # start-up refuses a longer one it cannot hold
ARRIVAL_STEPS = 3000
STEP_CAP = 8000  # about twice what the workload needs
PREFIXES = [tuple(range(100 * k, 100 * k + 8)) for k in range(1, 6)]


@dataclass(slots=True)
class Plan:
    request: GenerateRequest
    arrival: int
    abort_at: int | None  # step at which the client cancels, if it does
    abort_state: str | None = None  # where the request was when the abort was sent


def make_plans(rng: random.Random, with_priority: bool) -> list[Plan]:
    plans = []
    for i in range(NUM_REQUESTS):
        body = tuple(rng.randrange(900) for _ in range(rng.randint(1, 40)))
        prompt = rng.choice(PREFIXES) + body if rng.random() < 0.4 else body
        if rng.random() < 0.03:  # longer than the model or than the whole pool
            prompt = tuple(rng.randrange(900) for _ in range(rng.randint(90, 140)))
        if rng.random() < 0.05:  # runs into the eos: finishes with reason stop
            prompt = (*prompt[:-1], EOS - rng.randint(1, 5))
        params = SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 30))
        priority = rng.randint(-1, 3) if with_priority else 0
        arrival = rng.randrange(ARRIVAL_STEPS)
        abort_at = arrival + rng.choice([0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233]) \
            if rng.random() < 0.15 else None
        plans.append(Plan(GenerateRequest(f"r{i}", prompt, params, priority=priority),
                          arrival, abort_at))
    return plans


def state_of(engine: Engine, rid: str, ended: set[str]) -> str:
    """Where request `rid` is now, as the scheduler sees it."""
    if rid in ended:
        return "ended"
    for state, seqs in live(engine).items():
        if any(seq.request_id == rid for seq in seqs):
            return state
    return "not yet added"  # still in the engine's inbox


def live(engine: Engine) -> dict[str, list[RequestState]]:
    sched = engine.scheduler
    waiting: list[RequestState] = list(sched.waiting)  # type: ignore[attr-defined]
    running: list[RequestState] = list(sched.running)  # type: ignore[attr-defined]
    # Overlapped steps: running requests whose last token is on the device.
    finishing: list[RequestState] = list(sched.finishing)  # type: ignore[attr-defined]
    return {
        "waiting": [s for s in waiting if not s.num_preemptions],
        "preempted": [s for s in waiting if s.num_preemptions],
        "prefilling": [s for s in running if s.num_computed_tokens < s.num_tokens - 1],
        "decoding": [s for s in running if s.num_computed_tokens >= s.num_tokens - 1]
        + finishing,
    }


def abort(engine: Engine, plan: Plan, ended: set[str]) -> None:
    if plan.abort_state is None:  # a second abort of the same request must change nothing
        plan.abort_state = state_of(engine, plan.request.request_id, ended)
    engine.abort(plan.request.request_id)


def run(engine: Engine, plans: list[Plan], rng: random.Random) -> dict[str, list[TokenEvent]]:
    """Adds and aborts as planned, and besides, at random steps, aborts a random request in a
    random state (so every state is hit); steps until the engine is idle."""
    events: dict[str, list[TokenEvent]] = defaultdict(list)
    ended: set[str] = set()
    by_id = {p.request.request_id: p for p in plans}
    arrivals: dict[int, list[Plan]] = defaultdict(list)
    aborts: dict[int, list[Plan]] = defaultdict(list)
    for p in plans:
        arrivals[p.arrival].append(p)
        if p.abort_at is not None:
            aborts[p.abort_at].append(p)
    step = 0
    while step <= ARRIVAL_STEPS + 60 or engine.has_work():
        for p in arrivals.pop(step, []):
            engine.add_request(p.request)
        for p in aborts.pop(step, []):
            abort(engine, p, ended)
        if rng.random() < 0.03:
            seqs = live(engine)[rng.choice(["waiting", "prefilling", "decoding", "preempted"])]
            if seqs:
                abort(engine, by_id[rng.choice(seqs).request_id], ended)
        for ev in engine.step():
            assert ev.request_id not in ended, f"event after the terminal one: {ev!r}"
            events[ev.request_id].append(ev)
            if is_terminal(ev):
                ended.add(ev.request_id)
        step += 1
        assert step < STEP_CAP, "the engine did not finish within the step cap"
    return events


def check_request(plan: Plan, got: list[TokenEvent]) -> None:
    req = plan.request
    rid = req.request_id
    assert got and is_terminal(got[-1]), f"{rid}: no terminal event: {got}"
    assert sum(map(is_terminal, got)) == 1, f"{rid}: {got}"
    end = got[-1]
    fits = len(req.prompt_token_ids) + req.max_tokens <= POOL_TOKENS
    assert isinstance(end, Rejected) is not fits, f"{rid}: {end!r}"
    if isinstance(end, Rejected):
        assert got == [end] and f"maximum model length of {POOL_TOKENS}" in end.message, end
        return
    assert isinstance(end, Finished), f"{rid}: {end!r}"
    body = got[:-1]
    if body and isinstance(body[0], Scheduled):
        assert body[0].prompt_tokens == len(req.prompt_token_ids)
        body = body[1:]
    else:
        assert end.reason is FinishReason.ABORT, f"{rid} finished without Scheduled"
    assert all(isinstance(e, Token) for e in body), f"{rid}: {got}"
    tokens = [e.token_id for e in body if isinstance(e, Token)]
    last = req.prompt_token_ids[-1]
    assert tokens == [(last + k) % 1000 for k in range(1, len(tokens) + 1)]
    assert (end.prompt_tokens, end.completion_tokens) == (len(req.prompt_token_ids), len(tokens))
    if end.reason is FinishReason.ABORT:
        assert plan.abort_state not in (None, "ended"), f"{rid}: aborted unasked"
        if plan.abort_state in ("not yet added", "waiting"):
            assert got == [end], f"{rid}: aborted before admission yet got {got}"
    else:
        assert plan.abort_state in (None, "ended"), f"{rid}: abort while {plan.abort_state} lost"
        if end.reason is FinishReason.LENGTH:
            assert len(tokens) == req.max_tokens
        else:
            assert end.stop_token_id == EOS and (tokens or [last])[-1] == EOS - 1


@pytest.mark.parametrize("prefix_caching, seed", [(True, 1), (True, 2), (False, 3)])
@pytest.mark.parametrize("scheduler", ["fcfs", "priority"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlapped", "plain"])
def test_random_workload_ends_every_request_once_and_drains_kv(
        tmp_path: Path, scheduler: str, prefix_caching: bool, seed: int, overlap: bool) -> None:
    toy = write_toy_checkpoint(tmp_path / "toy", vocab_size=1000, eos_token_id=EOS)
    engine = Engine(EngineConfig(
        model=str(toy), device="cpu", scheduler=scheduler, block_size=BLOCK_SIZE,
        num_kv_blocks=NUM_KV_BLOCKS, max_num_batched_tokens=16, max_num_seqs=8,
        max_model_len=MAX_MODEL_LEN, enable_prefix_caching=prefix_caching,
        async_scheduling=overlap))
    assert engine.overlapped is overlap
    rng = random.Random(seed)
    plans = make_plans(rng, with_priority=scheduler == "priority")
    events = run(engine, plans, rng)

    assert set(events) == {p.request.request_id for p in plans}
    for plan in plans:
        check_request(plan, events[plan.request.request_id])
    assert engine.kv.num_used_blocks == 0 and not engine.has_work()
    # The workload exercised what it is meant to: preemption, rejection, and aborts in
    # every state of a request's life.
    assert engine.scheduler.num_preemptions >= 50  # type: ignore[attr-defined]
    ends = Counter(type(evs[-1]).__name__ if not isinstance(evs[-1], Finished)
                   else evs[-1].reason.value for evs in events.values())
    assert ends["Rejected"] >= 5 and ends["stop"] >= 5 and ends["length"] >= 200, ends
    states = Counter(p.abort_state for p in plans if p.abort_state)
    for state in ("waiting", "prefilling", "decoding", "preempted"):
        assert states[state] >= 5, states
    assert states["not yet added"] >= 1 and states["ended"] >= 1, states
