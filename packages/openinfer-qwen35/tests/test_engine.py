"""Qwen3.5 through `openinfer_core.Engine` on CPU, fp32, against transformers on a tiny
checkpoint it wrote (linear and full-attention layers mixed): greedy continuations identical
to transformers' generate (32 tokens) one request at a time, for staggered requests with
chunked prefill, under preemption (a tiny KV pool: requests recomputed from position 0 in a
new state slot) and with prefix caching asked for (no hits: hybrid prefixes are not cached);
prompt logprobs within 1e-4; every block and state slot given back at the end."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from checkpoints import write_causal_lm

from openinfer_core import Engine, EngineConfig, GenerateRequest, SamplingParams, Scheduled
from openinfer_core.events import PromptLogprobs
from openinfer_core.interfaces.kv import GroupedKV
from openinfer_core.testing import run_staggered, tokens_of

VOCAB = 384  # checkpoints.text_config's
BLOCK = 4
GREEDY_32 = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("qwen35-engine")
    return folder, write_causal_lm(folder, tie=False, seed=1)


_expected: dict[tuple[int, ...], list[int]] = {}


def hf_greedy(hf: torch.nn.Module, prompt: tuple[int, ...]) -> list[int]:
    """transformers' 32 greedy tokens after `prompt`, memoized. The attention mask is given:
    generate would otherwise mask every prompt token equal to the pad id."""
    if prompt not in _expected:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids),  # type: ignore[operator]
                              max_new_tokens=32, min_new_tokens=32, do_sample=False,
                              pad_token_id=0)
        _expected[prompt] = out[0, len(prompt):].tolist()
    return _expected[prompt]


def make_engine(folder: Path, **kw: object) -> Engine:
    config = EngineConfig(model=str(folder), device="cpu", block_size=BLOCK,
                          **kw)  # type: ignore[arg-type]
    return Engine(config)


def random_prompts(n: int, seed: int, lengths: tuple[int, int]) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(VOCAB) for _ in range(rng.randint(*lengths))) for _ in range(n)]


def check_greedy(engine: Engine, hf: torch.nn.Module, prompts: list[tuple[int, ...]],
                 arrival_step: int) -> None:
    requests = [GenerateRequest(f"r{i}", p, GREEDY_32) for i, p in enumerate(prompts)]
    events = run_staggered(engine, requests, lambda i: arrival_step * i)
    for r in requests:
        assert tokens_of(events[r.request_id]) == hf_greedy(hf, r.prompt_token_ids), (
            r.request_id)


def assert_all_freed(engine: Engine) -> None:
    assert isinstance(engine.kv, GroupedKV)
    assert [(u.name, u.used) for u in engine.kv.group_usage()] == [
        ("attention", 0), ("linear_state", 0)]


def test_one_request_at_a_time_and_prompt_logprobs(checkpoint) -> None:  # type: ignore[no-untyped-def]
    folder, hf = checkpoint
    engine = make_engine(folder, max_num_seqs=4, max_num_batched_tokens=64)
    assert isinstance(engine.kv, GroupedKV)
    # The state pool: one slot per running request (the padding slot excluded).
    assert engine.kv.group_usage()[1].total == 4
    prompts = random_prompts(2, seed=1, lengths=(9, 40))
    for prompt in prompts:
        check_greedy(engine, hf, [prompt], arrival_step=0)
    assert_all_freed(engine)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    events = run_staggered(engine, [GenerateRequest("lp", prompts[0], params)], lambda _: 0)
    [got] = [e for e in events["lp"] if isinstance(e, PromptLogprobs)]
    with torch.no_grad():
        logits = hf(torch.tensor([prompts[0]])).logits[0, :-1]
    want = logits.log_softmax(-1).gather(1, torch.tensor(prompts[0][1:])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(got.logprobs), want, atol=1e-4, rtol=0)
    assert_all_freed(engine)


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlapped"])
def test_staggered_requests_with_chunked_prefill(checkpoint, overlap: bool) -> None:  # type: ignore[no-untyped-def]
    """Ten requests joining every other step, prompts of up to 30 tokens chunked at 12
    tokens a step beside the others' decodes: each prompt's state carried over its chunks."""
    folder, hf = checkpoint
    engine = make_engine(folder, max_num_seqs=8, max_num_batched_tokens=12,
                         async_scheduling=overlap)
    assert engine.overlapped is overlap
    check_greedy(engine, hf, random_prompts(10, seed=2, lengths=(1, 30)), arrival_step=2)
    assert_all_freed(engine)


def test_preemption_recomputes_the_state(checkpoint) -> None:  # type: ignore[no-untyped-def]
    """A KV pool of 24 blocks (92 tokens) for six requests of up to 52 tokens each: some are
    preempted, their slots freed, and recomputed from position 0 in a new slot."""
    folder, hf = checkpoint
    engine = make_engine(folder, max_num_seqs=6, max_num_batched_tokens=16, num_kv_blocks=24)
    check_greedy(engine, hf, random_prompts(6, seed=3, lengths=(10, 20)), arrival_step=1)
    assert engine.scheduler.num_preemptions > 0  # type: ignore[attr-defined]
    assert_all_freed(engine)


def test_prefix_caching_hits_nothing_and_the_output_is_right(checkpoint) -> None:  # type: ignore[no-untyped-def]
    folder, hf = checkpoint
    engine = make_engine(folder, max_num_seqs=4, max_num_batched_tokens=64,
                         enable_prefix_caching=True)
    assert not engine.kv.enable_prefix_caching
    shared = random_prompts(1, seed=4, lengths=(24, 24))[0]
    for rid, prompt in (("a", shared), ("b", (*shared, 7)), ("c", (*shared, 7))):
        events = run_staggered(engine, [GenerateRequest(rid, prompt, GREEDY_32)],
                               lambda _: 0)[rid]
        assert events[0] == Scheduled(rid, len(prompt), cached_tokens=0)
        assert tokens_of(events) == hf_greedy(hf, prompt)
    assert engine.kv.prefix_cache_stats.hits == 0
    assert_all_freed(engine)
