"""How a model is cut for tensor parallelism: contiguous, near-even, rank 0 never smaller, and
every query head beside its KV head."""

from __future__ import annotations

import pytest
import torch

from openinfer_core.distributed.sharding import attention_heads, split_range, vocab_shard
from openinfer_core.errors import ModelConfigError
from openinfer_core.weights.checkpoint import get_part
from openinfer_core.weights.random_checkpoint import RandomCheckpoint


@pytest.mark.parametrize(("n", "parts"), [(7, 3), (8, 4), (3, 2), (1, 1), (2, 4)])
def test_split_range_tiles_in_order(n: int, parts: int) -> None:
    pieces = [split_range(n, parts, i) for i in range(parts)]
    assert [i for p in pieces for i in p] == list(range(n))
    sizes = [len(p) for p in pieces]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize(("heads", "kv", "size"), [
    (32, 8, 2), (32, 8, 8), (32, 8, 16), (4, 2, 2), (3, 3, 2), (5, 1, 2), (5, 1, 4),
    (40, 8, 3), (16, 2, 4)])
def test_every_query_head_has_its_kv_head(heads: int, kv: int, size: int) -> None:
    group = heads // kv
    shards = [attention_heads(heads, kv, r, size) for r in range(size)]
    assert [h for s in shards for h in s.q_heads] == list(range(heads))  # each head once
    for s in shards:
        assert len(s.q_heads) % len(s.kv_heads) == 0
        local_group = len(s.q_heads) // len(s.kv_heads)
        for i, h in enumerate(s.q_heads):  # local GQA: local head i uses local KV i // group
            assert s.kv_heads[i // local_group] == h // group
    kv_sizes = [len(s.kv_heads) for s in shards]
    assert kv_sizes[0] == max(kv_sizes)  # rank 0's KV block is the largest


def test_head_counts_that_cannot_split_are_refused() -> None:
    with pytest.raises(ModelConfigError, match="not a multiple"):
        attention_heads(32, 8, 0, 12)
    with pytest.raises(ModelConfigError, match="every rank needs a query head"):
        attention_heads(2, 1, 0, 4)


def test_vocab_parts_are_equal_width_and_cover_the_vocabulary() -> None:
    parts = [vocab_shard(151936 + 3, r, 4) for r in range(4)]
    assert {p.padded for p in parts} == {-(-(151936 + 3) // 4)}
    assert [i for p in parts for i in p.rows] == list(range(151936 + 3))


def test_a_dummy_checkpoints_part_is_the_part_of_its_whole_tensor() -> None:
    ckpt = RandomCheckpoint("unused")
    whole = ckpt.get("w", shape=(6, 4), dtype=torch.float32)
    rows = get_part(ckpt, "w", shape=(6, 4), dim=0, part=range(2, 5), dtype=torch.float32)
    cols = get_part(ckpt, "w", shape=(6, 4), dim=1, part=range(1, 3), dtype=torch.float32)
    assert torch.equal(rows, whole[2:5]) and torch.equal(cols, whole[:, 1:3])
