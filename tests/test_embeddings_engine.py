"""Pooling requests through the engine (task embed) against transformers' base Qwen3Model,
fp32 on CPU: the final-normed hidden state of the last prompt token, batched with chunked
prefill, in both step loops; event order; no KV kept after; refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import run_staggered
from qwen3_checkpoints import SPECS, hf_embedding, write_embedding_checkpoint
from test_golden_qwen3 import random_prompts

from openinfer_core import Engine, EngineConfig, GenerateRequest
from openinfer_core.errors import ModelConfigError
from openinfer_core.events import Embedding, Finished, FinishReason, Rejected, Scheduled
from openinfer_core.task import detect_task

SPEC = SPECS["gqa-tied"]


@pytest.fixture(scope="module")
def embed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_embedding_checkpoint(SPEC, tmp_path_factory.mktemp("embed") / "qwen3-embed")


@pytest.mark.parametrize("overlap", [True, False], ids=["overlapped", "plain"])
def test_embeddings_match_transformers_chunked_batch(embed_dir: Path, overlap: bool) -> None:
    engine = Engine(EngineConfig(model=str(embed_dir), device="cpu", max_num_batched_tokens=32,
                                 async_scheduling=overlap))
    assert engine.model_info.task == "embed" and engine.model_info.hidden_size == SPEC.hidden_size
    # One prompt longer than the step budget (chunked), the rest batched around it.
    prompts = random_prompts(4, 3, 1000, (3, 20)) + random_prompts(1, 4, 1000, (70, 80))
    requests = [GenerateRequest(f"e{i}", tuple(p), pooling=True) for i, p in enumerate(prompts)]
    events = run_staggered(engine, requests, lambda i: 0)
    for i, prompt in enumerate(prompts):
        evs = events[f"e{i}"]
        assert [type(e) for e in evs] == [Scheduled, Embedding, Finished], evs
        finished = evs[2]
        assert isinstance(finished, Finished)
        assert (finished.reason, finished.prompt_tokens, finished.completion_tokens) == (
            FinishReason.STOP, len(prompt), 0)
        ours = F.normalize(torch.tensor(evs[1].vector), dim=-1)
        torch.testing.assert_close(ours, hf_embedding(embed_dir, prompt), atol=1e-5, rtol=0)
    assert engine.kv.num_used_blocks == 0
    engine.close()


def test_task_detection_and_refusals(embed_dir: Path, qwen3_dir: Path, tmp_path: Path) -> None:
    assert detect_task(embed_dir) == "embed"
    assert detect_task(qwen3_dir) == "generate"
    engine = Engine(EngineConfig(model=str(embed_dir), device="cpu", max_model_len=64))
    long = GenerateRequest("long", tuple(range(1, 70)), pooling=True)
    generate = GenerateRequest("gen", (1, 2, 3))
    events = run_staggered(engine, [long, generate], lambda i: 0)
    assert isinstance(events["long"][0], Rejected)
    assert "69 tokens" in events["long"][0].message
    assert isinstance(events["gen"][0], Rejected)
    assert "embeddings" in events["gen"][0].message
    engine.close()
    # A generate checkpoint served with task embed pools its hidden states too.
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", task="embed"))
    events = run_staggered(engine, [GenerateRequest("p", (5, 6, 7), pooling=True)], lambda i: 0)
    assert [type(e) for e in events["p"]] == [Scheduled, Embedding, Finished]
    engine.close()
    # Other pooling modes are refused, naming the file.
    mean = tmp_path / "mean"
    (mean / "1_Pooling").mkdir(parents=True)
    (mean / "modules.json").write_text((embed_dir / "modules.json").read_text())
    (mean / "1_Pooling" / "config.json").write_text(
        '{"pooling_mode_mean_tokens": true, "pooling_mode_lasttoken": false}')
    with pytest.raises(ModelConfigError, match="pooling_mode_mean_tokens"):
        detect_task(mean)


def test_two_ranks_give_one_ranks_embeddings(embed_dir: Path) -> None:
    """Tensor parallelism: rank 0 returns the pooled vector after the workers ran the same
    forward up to the final norm."""
    prompts = random_prompts(3, 5, 1000, (3, 40))
    requests = [GenerateRequest(f"e{i}", tuple(p), pooling=True) for i, p in enumerate(prompts)]
    vectors = {}
    for size in (1, 2):
        engine = Engine(EngineConfig(model=str(embed_dir), device="cpu", num_kv_blocks=64,
                                     max_num_batched_tokens=32, tensor_parallel_size=size))
        try:
            events = run_staggered(engine, requests, lambda i: 0)
            vectors[size] = [torch.tensor(events[f"e{i}"][1].vector)
                             for i in range(len(prompts))]
            assert engine.kv.num_used_blocks == 0
        finally:
            engine.close()
    for one, two in zip(vectors[1], vectors[2], strict=True):
        torch.testing.assert_close(two, one, atol=1e-5, rtol=1e-5)
