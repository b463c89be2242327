"""Golden gate on CPU: our Qwen3 against transformers' Qwen3ForCausalLM, fp32."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from engine_helpers import finished_of, hf_greedy, prompt_logits, run_staggered, tokens_of
from qwen3_checkpoints import SPECS, load_hf

from openinfer_core import Engine, EngineConfig, FinishReason, GenerateRequest, SamplingParams

GREEDY_32 = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def random_prompts(n: int, seed: int, vocab: int, lengths: tuple[int, int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(*lengths))] for _ in range(n)]


@pytest.fixture(scope="module", params=sorted(SPECS))
def pair(request: pytest.FixtureRequest, qwen3_dirs: dict[str, Path]):
    path = qwen3_dirs[request.param]
    return request.param, Engine(EngineConfig(model=str(path), device="cpu")), load_hf(path)


def test_prefill_logits_match_transformers(pair) -> None:
    name, engine, hf = pair
    for ids in random_prompts(3, seed=1, vocab=SPECS[name].vocab_size, lengths=(1, 70)):
        ours = prompt_logits(engine, ids)
        with torch.inference_mode():
            ref = hf(torch.tensor([ids])).logits[0].float()
        rel = (ours - ref).norm() / ref.norm()
        assert rel < 1e-4, f"{name}: relative error {rel:.2e} for a {len(ids)}-token prompt"
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    assert engine.kv.num_used_blocks == 0


def test_greedy_one_at_a_time(pair) -> None:
    name, engine, hf = pair
    for i, ids in enumerate(random_prompts(2, seed=2, vocab=SPECS[name].vocab_size,
                                           lengths=(3, 40))):
        events = run_staggered(engine, [GenerateRequest(f"r{i}", tuple(ids), GREEDY_32)],
                               lambda _: 0)[f"r{i}"]
        assert tokens_of(events) == hf_greedy(hf, ids, 32)
        assert finished_of(events).reason is FinishReason.LENGTH
    assert engine.kv.num_used_blocks == 0


@pytest.mark.parametrize("budget", [8192, 24], ids=["whole-prefill", "chunked-prefill"])
def test_greedy_staggered_batch_matches_alone(pair, budget: int) -> None:
    """Ten requests join the running batch at different steps (prefill rows beside decode
    rows); each continuation must equal transformers' for that prompt alone."""
    name, engine, hf = pair
    engine.scheduler.config = type(engine.scheduler.config)(
        max_num_seqs=64, max_num_batched_tokens=budget,
        max_model_len=engine.model.max_model_len, eos_token_ids=engine.eos_token_ids)
    prompts = random_prompts(10, seed=3, vocab=SPECS[name].vocab_size, lengths=(1, 60))
    requests = [GenerateRequest(f"s{i}", tuple(p), GREEDY_32) for i, p in enumerate(prompts)]
    events = run_staggered(engine, requests, arrival_step=lambda i: 3 * i)
    for i, ids in enumerate(prompts):
        assert tokens_of(events[f"s{i}"]) == hf_greedy(hf, ids, 32), f"request s{i}"
    assert engine.kv.num_used_blocks == 0
