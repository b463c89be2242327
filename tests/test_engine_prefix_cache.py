"""The prefix cache through the engine (tiny fp32 Qwen3 on CPU, 4-token blocks): exact
`Scheduled.cached_tokens`, blocks shared while both requests run, counters, and greedy outputs
that do not change with the cache on or off, chunked prefill, or a pool small enough to preempt."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import finished_of, run_staggered, tokens_of

from openinfer_core import (
    Engine,
    EngineConfig,
    Finished,
    FinishReason,
    GenerateRequest,
    SamplingParams,
    Scheduled,
    Token,
)
from openinfer_core.interfaces.kv import PrefixCacheStats
from openinfer_kvcache import PagedKVManager

BLOCK = 4
SYSTEM = tuple(range(300, 314))  # a 14-token shared prefix: 3 full blocks


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def engine(qwen3_dir: Path, **kw: object) -> Engine:
    return Engine(EngineConfig(model=str(qwen3_dir), device="cpu", block_size=BLOCK,
                               **kw))  # type: ignore[arg-type]


def pool(e: Engine) -> PagedKVManager:
    assert isinstance(e.kv, PagedKVManager)
    return e.kv


def test_repeated_prompt_reports_exact_cached_tokens(qwen3_dir: Path) -> None:
    e = engine(qwen3_dir)
    a = run_staggered(e, [GenerateRequest("a", tuple(range(10)), greedy(3))], lambda _: 0)["a"]
    assert a[0] == Scheduled("a", prompt_tokens=10, cached_tokens=0)
    b = run_staggered(e, [GenerateRequest("b", tuple(range(10)), greedy(3))], lambda _: 0)["b"]
    # Blocks [0..3] and [4..7] are cached; 8, 9 sit in a partial block.
    assert b[0] == Scheduled("b", prompt_tokens=10, cached_tokens=8)
    assert [type(ev) for ev in b] == [Scheduled, Token, Token, Token, Finished]
    assert tokens_of(b) == tokens_of(a)
    assert finished_of(b) == Finished("b", FinishReason.LENGTH, 10, 3)
    # A prompt of exactly two cached blocks recomputes its last block.
    c = run_staggered(e, [GenerateRequest("c", tuple(range(8)), greedy(1))], lambda _: 0)["c"]
    assert c[0] == Scheduled("c", prompt_tokens=8, cached_tokens=4)
    assert e.snapshot().prefix_cache == PrefixCacheStats(queries=10 + 10 + 8, hits=8 + 4)
    assert e.kv.num_used_blocks == 0


def test_generated_tokens_are_cached_for_the_next_turn(qwen3_dir: Path) -> None:
    e = engine(qwen3_dir)
    prompt = (7, 8, 9, 10, 11, 12)
    a = tokens_of(run_staggered(e, [GenerateRequest("a", prompt, greedy(6))],
                                lambda _: 0)["a"])
    # 12 tokens, 11 with KV (the last sampled one never ran): blocks 0 and 1 are cached.
    turn = (*prompt, *a, 42, 43)
    b = run_staggered(e, [GenerateRequest("b", turn, greedy(2))], lambda _: 0)["b"]
    assert b[0] == Scheduled("b", prompt_tokens=14, cached_tokens=8)


def test_a_running_request_shares_its_prefix(qwen3_dir: Path) -> None:
    """b arrives after a's prefill step: it reuses a's blocks while a is still decoding."""
    e = engine(qwen3_dir)
    reqs = [GenerateRequest("a", (*SYSTEM, 1), greedy(6)),
            GenerateRequest("b", (*SYSTEM, 2), greedy(6))]
    e.add_request(reqs[0])
    e.step()  # a's whole prompt: blocks [1, 2, 3, 4]; [1, 2, 3] full and cached
    assert list(e.kv.block_ids("a")) == [1, 2, 3, 4]
    e.add_request(reqs[1])
    events = e.step()
    assert events[0] == Scheduled("b", prompt_tokens=15, cached_tokens=12)
    assert list(e.kv.block_ids("b")) == [1, 2, 3, 5]
    assert [pool(e).pool.ref_count(x) for x in (1, 2, 3, 4, 5)] == [2, 2, 2, 1, 1]
    while e.has_work():
        e.step()
    assert e.kv.num_used_blocks == 0


def test_disabled_prefix_cache_never_hits(qwen3_dir: Path) -> None:
    e = engine(qwen3_dir, enable_prefix_caching=False)
    assert not e.kv.enable_prefix_caching
    for rid in ("a", "b"):
        events = run_staggered(e, [GenerateRequest(rid, tuple(range(10)), greedy(2))],
                               lambda _: 0)[rid]
        assert events[0] == Scheduled(rid, prompt_tokens=10, cached_tokens=0)
    assert e.snapshot().prefix_cache == PrefixCacheStats(0, 0)


def _requests() -> list[GenerateRequest]:
    """Shared system prefixes of several lengths, repeats and a unique prompt."""
    prompts = [
        (*SYSTEM, 1, 2, 3),
        (*SYSTEM, 4),
        (*SYSTEM[:8], 5, 6, 7, 8, 9),
        (*SYSTEM, 1, 2, 3),
        tuple(range(500, 521)),
        (*SYSTEM, 4, 10, 11, 12, 13, 14),
    ]
    return [GenerateRequest(f"r{i}", p, greedy(12)) for i, p in enumerate(prompts)]


@pytest.fixture(scope="module")
def reference(qwen3_dirs: dict[str, Path]) -> dict[str, list[int]]:
    """Each request alone, no prefix cache, whole prompts in one step."""
    e = engine(qwen3_dirs["gqa-tied"], enable_prefix_caching=False)
    out = {}
    for r in _requests():
        out[r.request_id] = tokens_of(run_staggered(e, [r], lambda _: 0)[r.request_id])
    return out


@pytest.mark.parametrize("prefix", [True, False], ids=["cache", "no-cache"])
@pytest.mark.parametrize(("budget", "num_kv_blocks"), [
    (8192, None),
    (5, None),  # chunked prefill: at most 5 tokens a step
    (8192, 12),  # 11 usable blocks: requests of up to 8 blocks preempt each other
    (6, 12),
], ids=["plain", "chunked", "preempting", "chunked-preempting"])
def test_greedy_outputs_do_not_depend_on_the_prefix_cache(
        qwen3_dir: Path, reference: dict[str, list[int]], prefix: bool, budget: int,
        num_kv_blocks: int | None) -> None:
    e = engine(qwen3_dir, enable_prefix_caching=prefix, max_num_batched_tokens=budget,
               num_kv_blocks=num_kv_blocks)
    events = run_staggered(e, _requests(), lambda i: 3 * i)
    for rid, expected in reference.items():
        assert tokens_of(events[rid]) == expected, rid
        assert [type(ev) for ev in events[rid]] == [Scheduled] + [Token] * 12 + [Finished]
    snap = e.snapshot()
    if num_kv_blocks is not None:
        assert snap.num_preemptions > 0
    if prefix:
        assert snap.prefix_cache.hits > 0
        assert sum(ev.cached_tokens for evs in events.values() for ev in evs
                   if isinstance(ev, Scheduled)) > 0
    else:
        assert snap.prefix_cache == PrefixCacheStats(0, 0)
    assert e.kv.num_used_blocks == 0
