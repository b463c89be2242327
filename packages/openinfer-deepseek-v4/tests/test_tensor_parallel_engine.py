"""DeepSeek-V4 over two ranks on CPU (gloo, fp32): attention split by heads, the routed experts
split by width (`--tensor-parallel-size 2`) or whole (`--enable-expert-parallel`), the
vocabulary split, and with the indexer's top-k split by token; greedy tokens under
continuous batching with chunked prefill equal one rank's, prefill logits equal them within
fp32 rounding, and each rank reads only its shard.
The tiny model of conftest.py with 4 heads in 2 output groups and an odd vocabulary (63: the
last rank's part is padded)."""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from dsv4_checkpoints import random_model, write_model_folder

from openinfer_core import Engine, EngineConfig, GenerateRequest, SamplingParams
from openinfer_core.distributed import TensorParallelModel
from openinfer_core.engine.batch import plan_batch
from openinfer_core.engine.request_state import RequestState
from openinfer_core.interfaces.scheduler import ScheduledRow
from openinfer_core.testing import run_staggered
from openinfer_core.testing import tokens_of as tokens
from openinfer_core.weights.checkpoint import Checkpoint
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.model import DeepseekV4Model
from openinfer_deepseek_v4.paged_attention import INDEXER_SPLIT_ENV
from openinfer_deepseek_v4.reference import ModelWeights
from openinfer_deepseek_v4.shard import DeepseekV4Shard
from openinfer_deepseek_v4.weights import load_weights

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
VOCAB = 63


@pytest.fixture(scope="module")
def folder(config, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    settings = json.loads(config.to_json_string()) | {"num_attention_heads": 4,
                                                       "vocab_size": VOCAB}
    model = random_model(type(config)(**settings), scale=0.5)
    return write_model_folder(model, tmp_path_factory.mktemp("dsv4-tp") / "tiny")


def engine(folder: Path, **kw: object) -> Engine:
    return Engine(EngineConfig(model=str(folder), device="cpu", max_model_len=256,
                               max_num_batched_tokens=7, block_size=8,
                               **kw))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def one(folder: Path) -> Engine:
    return engine(folder)


@pytest.fixture(scope="module", params=["tp", "tp+ep", "tp+split-indexer"])
def two(request: pytest.FixtureRequest, folder: Path) -> Iterator[Engine]:
    """Two ranks (one group per process: the kinds are built one after the other).
    tp+split-indexer: every step's indexer top-k split by token over the ranks (from 1 token;
    set before the ranks build their models, each of which reads it then)."""
    split = request.param == "tp+split-indexer"
    before = os.environ.get(INDEXER_SPLIT_ENV)
    if split:
        os.environ[INDEXER_SPLIT_ENV] = "1"
    try:
        eng = engine(folder, tensor_parallel_size=2,
                     enable_expert_parallel=request.param == "tp+ep")
        assert isinstance(eng.model, TensorParallelModel)
        local = eng.model.local
        assert isinstance(local, DeepseekV4Model) and local.shard is not None
        assert local.shard.expert_parallel == (request.param == "tp+ep")
        yield eng
        eng.model.close()
    finally:
        if split and before is None:
            del os.environ[INDEXER_SPLIT_ENV]
        elif split:
            os.environ[INDEXER_SPLIT_ENV] = before  # type: ignore[assignment]


def prompts(n: int, seed: int, lengths: tuple[int, int]) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(2, VOCAB) for _ in range(rng.randint(*lengths)))
            for _ in range(n)]


@torch.inference_mode()
def prompt_logits(eng: Engine, token_ids: Sequence[int]) -> torch.Tensor:
    """fp32 logits at every prompt position, from one prefill (blocks freed after)."""
    seq = RequestState.from_request(GenerateRequest("probe", tuple(token_ids)))
    assert eng.kv.allocate(seq.request_id, len(token_ids))
    try:
        host = plan_batch([ScheduledRow(seq, len(token_ids), True)], eng.kv)
        host.logits_indices = np.arange(len(token_ids), dtype=np.int64)
        return eng.model.forward(host.to_device(eng.model.device))
    finally:
        eng.kv.free(seq.request_id)


def test_prefill_logits_match_one_rank(one: Engine, two: Engine) -> None:
    for ids in prompts(3, seed=1, lengths=(1, 45)):
        ref, got = prompt_logits(one, ids), prompt_logits(two, ids)
        assert got.shape == (len(ids), VOCAB)
        # fp32: the ranks' partial sums (attention heads, expert widths or experts) are
        # added in another order than one rank's matmuls.
        rel = (got - ref).norm() / ref.norm()
        assert rel < 1e-5, f"relative error {rel:.2e} for a {len(ids)}-token prompt"
        assert torch.equal(got.argmax(-1), ref.argmax(-1))
    assert two.kv.num_used_blocks == 0


def test_prompts_of_any_length_against_one_rank(one: Engine, two: Engine) -> None:
    """Prompts of 1 token (with the indexer split, rank 1's share empty), 7 (uneven shares)
    and 44 (past several compressed windows, more entries than the indexer picks)."""
    for length, seed in ((1, 5), (7, 6), (44, 7)):
        ids = prompts(1, seed=seed, lengths=(length, length))[0]
        ref, got = prompt_logits(one, ids), prompt_logits(two, ids)
        rel = (got - ref).norm() / ref.norm()
        assert rel < 1e-5, f"relative error {rel:.2e} for a {length}-token prompt"
        assert torch.equal(got.argmax(-1), ref.argmax(-1))
    assert two.kv.num_used_blocks == 0


@pytest.mark.slow
def test_greedy_staggered_chunked_batch_matches_one_rank(one: Engine, two: Engine) -> None:
    """Ten requests join the running batch at different steps, prompts split over steps by a
    7-token budget beside decodes (the first arrives alone: its first steps sample nothing):
    the two-rank tokens equal the one-rank tokens."""
    batch = prompts(10, seed=3, lengths=(1, 40))
    batch[0] = prompts(1, seed=4, lengths=(30, 30))[0]
    results = []
    for eng in (one, two):
        requests = [GenerateRequest(f"s{i}", p, GREEDY) for i, p in enumerate(batch)]
        events = run_staggered(eng, requests, arrival_step=lambda i: 2 * i)
        results.append({rid: tokens(evs) for rid, evs in events.items()})
        assert eng.kv.num_used_blocks == 0
    for i in range(len(batch)):
        assert len(results[0][f"s{i}"]) == GREEDY.max_tokens
        assert results[1][f"s{i}"] == results[0][f"s{i}"], f"request s{i}"


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp", "tp+ep"])
def test_each_rank_reads_only_its_shard(folder: Path, expert_parallel: bool) -> None:
    """Each of 2 ranks reads its slices and experts of the split tensors and the replicated
    ones whole (so the two read the split ones once between them), and the parts put back
    together are the whole tensors."""
    cfg = DeepseekV4Config.from_dict(json.loads((folder / "config.json").read_text()))
    whole_ckpt = Checkpoint(folder)
    cpu, fp32 = torch.device("cpu"), torch.float32
    whole = load_weights(whole_ckpt, cfg, dtype=fp32, device=cpu)
    parts: list[ModelWeights] = []
    shards = [DeepseekV4Shard.of(cfg, r, 2, expert_parallel) for r in range(2)]
    read = []
    for shard in shards:
        ckpt = Checkpoint(folder)
        parts.append(load_weights(ckpt, cfg, dtype=fp32, device=cpu, shard=shard))
        read.append(ckpt.bytes_read)
    split = re.compile(r"attn\.(wq_b|wo_a|wo_b)\.weight|attn_sink|ffn\.experts\.|embed|head\.weight"
                       r"|shared_experts")
    split_bytes = sum(t.numel() * t.element_size() for name in whole_ckpt.names()
                      if split.search(name) for t in [whole_ckpt.get(name)])
    total = whole_ckpt.bytes_read - split_bytes  # (`get` counts the bytes it hands out)
    assert sum(read) == 2 * (total - split_bytes) + split_bytes
    assert abs(read[0] - read[1]) < 0.05 * split_bytes
    inter = cfg.moe_intermediate_size
    for n, layer in enumerate(whole.layers):
        a = [p.layers[n].attention for p in parts]
        assert torch.equal(torch.cat([x.q_b for x in a]), layer.attention.q_b)  # type: ignore[misc]
        assert torch.equal(torch.cat([x.sinks for x in a]), layer.attention.sinks)
        assert torch.equal(torch.cat([x.o_a for x in a]), layer.attention.o_a)  # type: ignore[misc]
        assert torch.equal(torch.cat([x.o_b for x in a], 1), layer.attention.o_b)  # type: ignore[misc]
        assert all(torch.equal(x.kv, layer.attention.kv) for x in a)  # type: ignore[arg-type]
        m = [p.layers[n].moe for p in parts]
        gate_up, down = layer.moe.gate_up, layer.moe.down
        assert isinstance(gate_up, torch.Tensor) and down is not None
        # The shared expert by width either way: its down columns.
        assert torch.equal(torch.cat([x.shared_down for x in m], 1), layer.moe.shared_down)  # type: ignore[misc]
        if expert_parallel:
            assert torch.equal(torch.cat([x.gate_up for x in m]), gate_up)  # type: ignore[misc]
        else:  # each rank: its rows of w1, then of w3
            halves = [x.gate_up.chunk(2, dim=1) for x in m]  # type: ignore[union-attr]
            assert torch.equal(torch.cat([h[0] for h in halves] + [h[1] for h in halves], 1),
                               gate_up)
            assert gate_up.shape[1] == 2 * inter
        assert torch.equal(torch.cat([x.down for x in m], -1 if not expert_parallel else 0),  # type: ignore[misc]
                           down)
    vocab = torch.cat([p.embed[:len(s.vocab.rows)] for p, s in zip(parts, shards, strict=True)])
    assert torch.equal(vocab, whole.embed)
    assert all(p.embed.shape[0] == shards[0].vocab.padded for p in parts)
