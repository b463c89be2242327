"""Overlapped steps (engine/overlap.py) against the plain loop: the same greedy fp32 outputs,
logprobs, seeded samples and finish reasons under continuous batching, chunked prefill,
preemption, prefix-cache hits, stops and penalties; and the KV pool drains."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from engine_helpers import run_staggered

from openinfer_core import (
    Engine,
    EngineConfig,
    Finished,
    FinishReason,
    GenerateRequest,
    SamplingParams,
    Scheduled,
    Token,
    TokenEvent,
)

SYSTEM = tuple(range(300, 318))  # shared by half the prompts: prefix-cache hits
STOPS = tuple(range(0, 151_936, 3))


def workload(seed: int, n: int = 16) -> list[GenerateRequest]:
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        body = tuple(rng.randrange(1, 1000) for _ in range(rng.randint(1, 24)))
        prompt = SYSTEM[:rng.randint(8, 18)] + body if i % 2 else body
        kind = i % 4
        if kind == 0:  # greedy, stops only at max_tokens
            params = SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 24),
                                    ignore_eos=True)
        elif kind == 1:  # greedy, with logprobs and stop tokens (a third of the vocabulary)
            params = SamplingParams(temperature=0.0, max_tokens=rng.randint(4, 24), logprobs=3,
                                    stop_token_ids=STOPS)
        elif kind == 2:  # seeded sampling: its noise depends on its own position only
            params = SamplingParams(temperature=0.9, top_k=20, seed=i, max_tokens=16)
        else:  # penalties read the tokens so far on the host
            params = SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=1.3,
                                    frequency_penalty=0.5, min_tokens=3)
        reqs.append(GenerateRequest(f"r{i}", prompt, params))
    return reqs


def run(qwen3_dir: Path, overlap: bool, reqs: list[GenerateRequest],
        **config: object) -> tuple[Engine, dict[str, list[TokenEvent]]]:
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", block_size=4,
                                 async_scheduling=overlap, **config))  # type: ignore[arg-type]
    assert engine.overlapped is overlap
    events = run_staggered(engine, reqs, lambda i: (i * 3) // 2)
    assert engine.kv.num_used_blocks == 0 and not engine.has_work()
    return engine, events


def summary(events: list[TokenEvent]) -> tuple[object, ...]:
    """What a client sees: tokens with their logprobs, and how the request ended."""
    end = events[-1]
    assert isinstance(end, Finished), end
    assert isinstance(events[0], Scheduled)
    assert all(isinstance(e, Token) for e in events[1:-1])
    tokens = [(e.token_id, e.logprob, e.top_logprobs) for e in events if isinstance(e, Token)]
    return (tokens, end.reason, end.prompt_tokens, end.completion_tokens, end.stop_token_id)


def close(a: object, b: object) -> bool:
    """Equal, with logprobs within fp32 noise of a different batch composition."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-4
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


CASES = {
    # continuous batching with plenty of room
    "batching": {},
    # chunked prefill: 8 tokens per step across all requests
    "chunked": {"max_num_batched_tokens": 8},
    # 13 usable 4-token blocks: requests preempt each other and recompute
    "preemption": {"num_kv_blocks": 18, "max_num_batched_tokens": 24},
}


@pytest.mark.parametrize("case", list(CASES))
def test_overlapped_and_plain_loops_give_the_same_outputs(qwen3_dir: Path, case: str) -> None:
    reqs = workload(seed=len(case))
    plain, want = run(qwen3_dir, False, reqs, **CASES[case])
    overlapped, got = run(qwen3_dir, True, reqs, **CASES[case])
    assert set(got) == set(want) == {r.request_id for r in reqs}
    for r in reqs:
        assert close(summary(got[r.request_id]), summary(want[r.request_id])), r.request_id
    ends = [summary(want[r.request_id])[1] for r in reqs]
    assert FinishReason.STOP in ends and FinishReason.LENGTH in ends
    if case == "preemption":
        assert overlapped.scheduler.num_preemptions > 0  # type: ignore[attr-defined]
        assert plain.scheduler.num_preemptions > 0  # type: ignore[attr-defined]
    if case != "preemption":  # preemption recomputes, so the lookups differ between loops
        hits = overlapped.snapshot().prefix_cache.hits
        assert hits > 0 and hits == plain.snapshot().prefix_cache.hits


def test_a_stopped_request_loses_only_its_extra_step(qwen3_dir: Path) -> None:
    """A request whose stop token is found a step late had one more step scheduled; nothing of
    it reaches the client and its KV comes back."""
    probe = GenerateRequest("probe", (5, 6, 7), SamplingParams(temperature=0.0, max_tokens=6,
                                                               ignore_eos=True))
    _, events = run(qwen3_dir, False, [probe])
    tokens = [e.token_id for e in events["probe"] if isinstance(e, Token)]
    stop_at = tokens[3]
    req = GenerateRequest("a", (5, 6, 7), SamplingParams(temperature=0.0, max_tokens=6,
                                                         stop_token_ids=(stop_at,)))
    _, got = run(qwen3_dir, True, [req])
    assert [e.token_id for e in got["a"] if isinstance(e, Token)] == tokens[:tokens.index(
        stop_at)]
    end = got["a"][-1]
    assert isinstance(end, Finished) and end.reason is FinishReason.STOP
    assert end.stop_token_id == stop_at


def test_abort_while_a_step_is_in_flight(qwen3_dir: Path) -> None:
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu"))
    assert engine.overlapped
    engine.add_request(GenerateRequest("a", (1, 2, 3), SamplingParams(max_tokens=50)))
    events = engine.step() + engine.step() + engine.step()
    engine.abort("a")
    while engine.has_work():
        events += engine.step()
    end = events[-1]
    tokens = [e for e in events if isinstance(e, Token)]
    assert isinstance(end, Finished) and end.reason is FinishReason.ABORT
    assert end.completion_tokens == len(tokens) >= 1  # a pending slot is not a token
    assert engine.kv.num_used_blocks == 0


def test_a_dropped_engine_is_freed_without_the_cycle_collector(qwen3_dir: Path) -> None:
    """No reference cycle: on the GPU a dropped engine's CUDA graphs and events must go when
    the last reference does, not whenever the collector runs (in another engine's graph
    capture, it would invalidate the capture)."""
    import gc
    import weakref

    gc.disable()
    try:
        engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu"))
        engine.add_request(GenerateRequest("a", (1, 2, 3), SamplingParams(max_tokens=4)))
        engine.step()  # a step in flight
        ref = weakref.ref(engine)
        del engine
        assert ref() is None
    finally:
        gc.enable()
