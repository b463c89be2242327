"""Prompt logprobs from the engine against transformers' log-softmax of the prompt, fp32 on CPU:
whole and chunked prefill, after a prefix-cache hit, under preemption, in both step loops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import run_staggered, tokens_of
from qwen3_checkpoints import load_hf
from test_golden_qwen3 import random_prompts

from openinfer_core import Engine, EngineConfig, GenerateRequest, SamplingParams
from openinfer_core.engine import scheduler as scheduler_module
from openinfer_core.events import PromptLogprobs, Scheduled, Token

TOP = 5


@pytest.fixture(scope="module")
def hf(qwen3_dir: Path):
    return load_hf(qwen3_dir)


def reference(hf, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                          torch.Tensor]:
    """For prompt tokens i >= 1: the logprob of token i given the ones before, the range its
    rank may take within the tolerance (near-ties among 150k logprobs may swap), and the top-5
    logprobs."""
    with torch.inference_mode():
        lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)[:-1]
    target = torch.tensor(ids[1:])
    chosen = lp.gather(1, target.unsqueeze(1))
    best_rank = (lp > chosen + 1e-4).sum(1) + 1
    worst_rank = (lp > chosen - 1e-4).sum(1) + 1
    return chosen.squeeze(1), best_rank, worst_rank, lp.topk(TOP, dim=-1).values


def prompt_event(events) -> PromptLogprobs:
    kinds = [type(e) for e in events]
    assert kinds[0] is Scheduled and kinds[1] is PromptLogprobs and kinds[2] is Token, kinds
    return events[1]


def check(event: PromptLogprobs, hf, ids: list[int]) -> None:
    chosen, best_rank, worst_rank, top = reference(hf, ids)
    assert len(event.logprobs) == len(ids) - 1
    torch.testing.assert_close(torch.tensor(event.logprobs), chosen, atol=1e-4, rtol=0)
    ranks = torch.tensor(event.ranks)
    assert bool(((best_rank <= ranks) & (ranks <= worst_rank)).all()), (ranks, best_rank)
    ours_top = torch.tensor([[lp for _, lp in t] for t in event.top])
    torch.testing.assert_close(ours_top, top, atol=1e-4, rtol=0)


def ask(i: int, ids: list[int], **kw: Any) -> GenerateRequest:
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 3, "prompt_logprobs": TOP,
                               **kw})
    return GenerateRequest(f"r{i}", tuple(ids), params)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlapped", "plain"])
@pytest.mark.parametrize("budget", [8192, 16], ids=["whole-prefill", "chunked-prefill"])
def test_prompt_logprobs_match_transformers(qwen3_dir: Path, hf, budget: int,
                                            overlap: bool) -> None:
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", async_scheduling=overlap,
                                 max_num_batched_tokens=budget))
    prompts = random_prompts(4, seed=11, vocab=1000, lengths=(2, 70))
    events = run_staggered(engine, [ask(i, p) for i, p in enumerate(prompts)], lambda i: i)
    for i, ids in enumerate(prompts):
        check(prompt_event(events[f"r{i}"]), hf, ids)
    assert engine.kv.num_used_blocks == 0


def test_prompt_chunks_are_capped(qwen3_dir: Path, hf, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt longer than the per-step cap of kept logits rows goes in several steps."""
    monkeypatch.setattr(scheduler_module, "PROMPT_LOGPROBS_CHUNK", 7)
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu"))
    ids = random_prompts(1, seed=12, vocab=1000, lengths=(40, 40))[0]
    events = run_staggered(engine, [ask(0, ids)], lambda i: 0)["r0"]
    check(prompt_event(events), hf, ids)


def test_prefix_cache_hit_is_recomputed_for_prompt_logprobs(qwen3_dir: Path, hf) -> None:
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu"))
    ids = random_prompts(1, seed=13, vocab=1000, lengths=(50, 50))[0]
    warm = GenerateRequest("warm", tuple(ids), SamplingParams(temperature=0.0, max_tokens=2))
    first = run_staggered(engine, [warm], lambda i: 0)["warm"]
    assert first[0].cached_tokens == 0
    again = GenerateRequest("hit", tuple(ids), SamplingParams(temperature=0.0, max_tokens=2))
    assert run_staggered(engine, [again], lambda i: 0)["hit"][0].cached_tokens == 48
    events = run_staggered(engine, [ask(0, ids)], lambda i: 0)["r0"]
    assert events[0].cached_tokens == 0
    check(prompt_event(events), hf, ids)
    assert tokens_of(events)[:2] == tokens_of(first)


def test_preemption_sends_each_position_once(qwen3_dir: Path, hf) -> None:
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", num_kv_blocks=8,
                                 max_num_batched_tokens=16))
    prompts = random_prompts(3, seed=14, vocab=1000, lengths=(30, 45))
    reqs = [ask(i, p, max_tokens=20, ignore_eos=True) for i, p in enumerate(prompts)]
    events = run_staggered(engine, reqs, lambda i: i)
    assert engine.scheduler.num_preemptions > 0
    for i, ids in enumerate(prompts):
        assert sum(isinstance(e, PromptLogprobs) for e in events[f"r{i}"]) == 1
        check(prompt_event(events[f"r{i}"]), hf, ids)


def test_one_token_prompt_has_no_prompt_logprobs_event(qwen3_dir: Path) -> None:
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu"))
    events = run_staggered(engine, [ask(0, [42])], lambda i: 0)["r0"]
    assert not any(isinstance(e, PromptLogprobs) for e in events)
    assert len(tokens_of(events)) == 3
