"""Tensor parallelism on CPU (gloo, 2 ranks): a Qwen3 split over two processes must give the
tokens one process gives, under continuous batching (failures: test_tensor_parallel_failures.py;
one torch.distributed group per process, so they cannot share this module's engines)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from engine_helpers import prompt_logits, run_staggered, tokens_of
from qwen3_checkpoints import SPECS
from tp_helpers import tp2_engine

from openinfer_core import Engine, EngineConfig, GenerateRequest, SamplingParams
from openinfer_core.distributed import TensorParallelModel
from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.capabilities import supports_started
from openinfer_core.weights.checkpoint import Checkpoint
from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.weights import Qwen3Shard, load_weights

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def random_prompts(n: int, seed: int, lengths: tuple[int, int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, 151000) for _ in range(rng.randint(*lengths))]
            for _ in range(n)]


@pytest.fixture(scope="module", params=sorted(SPECS))
def engines(request: pytest.FixtureRequest,
            qwen3_dirs: dict[str, Path]) -> Iterator[tuple[str, Engine, Engine]]:
    """(spec, one rank, two ranks). gqa-tied splits its 2 KV heads; odd-sizes replicates its
    one KV head and splits 5 query heads 3 + 2; mha-untied splits 3 heads 2 + 1."""
    path = qwen3_dirs[request.param]
    one = Engine(EngineConfig(model=str(path), device="cpu"))
    two = tp2_engine(path)
    assert isinstance(two.model, TensorParallelModel)
    # Start-up sent the worker `started` (on CUDA it then logs its late compiles): a message
    # it did not take would have ended it, and every test below would fail.
    assert supports_started(two.model)
    yield request.param, one, two
    two.model.close()


def test_prefill_logits_match_one_rank(engines: tuple[str, Engine, Engine]) -> None:
    name, one, two = engines
    for ids in random_prompts(3, seed=1, lengths=(1, 70)):
        ref, got = prompt_logits(one, ids), prompt_logits(two, ids)
        # fp32: the ranks' partial sums are added in another order than one matmul's.
        rel = (got - ref).norm() / ref.norm()
        assert rel < 1e-5, f"{name}: relative error {rel:.2e} for a {len(ids)}-token prompt"
        assert torch.equal(got.argmax(-1), ref.argmax(-1))
    assert two.kv.num_used_blocks == 0


@pytest.mark.slow
@pytest.mark.parametrize("budget", [8192, 24], ids=["whole-prefill", "chunked-prefill"])
def test_greedy_staggered_batch_matches_one_rank(engines: tuple[str, Engine, Engine],
                                                 budget: int) -> None:
    """Eight requests join the running batch at different steps (prefill chunks beside
    decodes): the two-rank engine's tokens equal the one-rank engine's."""
    name, one, two = engines
    prompts = random_prompts(8, seed=3, lengths=(1, 50))
    results = []
    for engine in (one, two):
        engine.scheduler.config = type(engine.scheduler.config)(
            max_num_seqs=64, max_num_batched_tokens=budget,
            max_model_len=engine.model.max_model_len, eos_token_ids=engine.eos_token_ids)
        requests = [GenerateRequest(f"s{i}", tuple(p), GREEDY) for i, p in enumerate(prompts)]
        results.append(run_staggered(engine, requests, arrival_step=lambda i: 3 * i))
        assert engine.kv.num_used_blocks == 0
    for i in range(len(prompts)):
        ref, got = tokens_of(results[0][f"s{i}"]), tokens_of(results[1][f"s{i}"])
        assert len(ref) == GREEDY.max_tokens
        assert got == ref, f"{name}: request s{i}"



@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_rank_reads_only_its_shard(qwen3_dirs: dict[str, Path], name: str) -> None:
    """Each of 2 ranks reads about half the checkpoint (the vocabulary dominates), the parts
    put back together are the whole tensors, and a replicated KV head is whole on both."""
    path = qwen3_dirs[name]
    cfg = Qwen3Config.from_dict(json.loads((path / "config.json").read_text()))
    whole_ckpt = Checkpoint(path)
    whole = load_weights(whole_ckpt, cfg, dtype=torch.float32, device=torch.device("cpu"))
    parts, shards = [], []
    for rank in range(2):
        ckpt = Checkpoint(path)
        shard = Qwen3Shard.of(cfg, rank, 2)
        parts.append(load_weights(ckpt, cfg, dtype=torch.float32, device=torch.device("cpu"),
                                  shard=shard))
        shards.append(shard)
        assert ckpt.bytes_read < 0.55 * whole_ckpt.bytes_read, f"rank {rank}"
    d = cfg.head_dim
    for n, layer in enumerate(whole.layers):
        q, k, _ = layer.qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size])
        q_parts, k_parts = [], []
        for part, shard in zip(parts, shards, strict=True):
            nq, nkv = len(shard.heads.q_heads) * d, len(shard.heads.kv_heads) * d
            pq, pk, _ = part.layers[n].qkv.split([nq, nkv, nkv])
            q_parts.append(pq)
            k_parts.append(pk)
        assert torch.equal(torch.cat(q_parts), q)
        if cfg.num_kv_heads >= 2:
            assert torch.equal(torch.cat(k_parts), k)
        else:  # one KV head, replicated
            assert all(torch.equal(p, k) for p in k_parts)
        assert torch.equal(torch.cat([p.layers[n].o_proj for p in parts], 1), layer.o_proj)
        assert torch.equal(torch.cat([p.layers[n].down for p in parts], 1), layer.down)
    vocab = torch.cat([p.embed[:len(s.vocab.rows)] for p, s in zip(parts, shards, strict=True)])
    assert torch.equal(vocab, whole.embed)


def test_expert_parallel_is_refused_for_a_line_without_experts(
        qwen3_dirs: dict[str, Path]) -> None:
    path = qwen3_dirs[sorted(SPECS)[0]]
    with pytest.raises(ModelConfigError, match="no routed experts"):
        Engine(EngineConfig(model=str(path), device="cpu", tensor_parallel_size=2,
                            enable_expert_parallel=True))


def test_the_expert_parallel_flag_reaches_the_engine_config() -> None:
    from openinfer_core.plugins import get_plugin_manager
    from openinfer_server.cli import build_parser
    from openinfer_server.serve import engine_config

    parser = build_parser()
    for argv, want in ((["-tp", "2", "--enable-expert-parallel"], True), (["-tp", "2"], False)):
        args = parser.parse_args(["serve", "--device", "cpu", *argv])
        config = engine_config(args, parser, get_plugin_manager().registries)
        assert config.enable_expert_parallel is want
