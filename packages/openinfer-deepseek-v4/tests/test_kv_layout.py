"""The paged cache's layout (kv_cache.py): where each compressed entry lives, what a block
costs; and the indexer's top-k with ties given to the earlier entry."""

from __future__ import annotations

import pytest
import torch

from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.kernels.indexer import indexer_topk_ref
from openinfer_deepseek_v4.kernels.indexer.ordered_topk import indexer_topk_ordered_ref
from openinfer_deepseek_v4.kv_cache import (
    CompressedCache,
    entries_per_block,
    kv_bytes_per_block,
    token_slots,
)

FLASH = {  # V4-Flash's shapes, 43 layers: 2 window-only, then CSA (4) and HCA (128) in turn
    "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43,
    "num_attention_heads": 64, "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024,
    "o_groups": 8, "o_lora_rank": 1024, "sliding_window": 128, "n_routed_experts": 256,
    "num_experts_per_tok": 6, "moe_intermediate_size": 2048, "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
    "max_position_embeddings": 1048576,
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
}


@pytest.mark.parametrize(("block_size", "ratio", "slots"),
                         [(16, 4, 4), (16, 128, 1), (16, 8, 2), (6, 4, 2), (6, 8, 1)])
def test_entries_per_block(block_size: int, ratio: int, slots: int) -> None:
    assert entries_per_block(block_size, ratio) == slots


@pytest.mark.parametrize(("block_size", "ratio"), [(16, 4), (16, 128), (6, 4), (6, 8), (4, 8)])
def test_each_entry_has_its_own_slot_in_the_block_of_its_last_token(block_size: int,
                                                                     ratio: int) -> None:
    blocks = 40
    table = torch.randperm(blocks - 1)[:-1] + 1  # any blocks but the padding block 0
    part = CompressedCache(ratio, torch.zeros(blocks, block_size, 1),
                           torch.zeros(blocks, entries_per_block(block_size, ratio), 1))
    entries = torch.arange(len(table) * block_size // ratio)
    slots = part.entry_slots(table, entries)
    assert len(set(slots.tolist())) == len(entries)
    last = token_slots(table, (entries + 1) * ratio - 1, block_size)
    assert torch.equal(slots // part.entries.shape[1], last // block_size)


def test_bytes_per_block_of_v4_flash() -> None:
    cfg = DeepseekV4Config.from_dict(FLASH)
    window = 16 * 512  # raw entries
    csa = window + 16 * 2 * 1024 + 4 * 512 + 16 * 2 * 256 + 4 * 128  # + compressor, indexer
    hca = window + 16 * 2 * 512 + 1 * 512
    want = 2 * (2 * window + 21 * csa + 20 * hca)
    assert kv_bytes_per_block(cfg, 16, torch.bfloat16) == want
    assert want // 16 == 200_512  # bytes per token (window, projections and entries, all kept)


def test_ordered_topk_breaks_ties_by_entry_whatever_the_width() -> None:
    scores = torch.tensor([[0.0, 0.3, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0]])
    position = torch.tensor([19])  # sees entries 0..4
    picks = indexer_topk_ordered_ref(scores, position, ratio=4, top_k=3)
    assert picks.tolist() == [[3, 1, 0]]
    narrow = indexer_topk_ordered_ref(scores[:, :5], position, ratio=4, top_k=3)
    assert narrow.tolist() == [[3, 1, 0]]
    # fewer visible than k: -1 pads
    assert indexer_topk_ordered_ref(scores, torch.tensor([7]), ratio=4, top_k=3).tolist() == [
        [1, 0, -1]]


def test_ordered_topk_picks_the_same_set_as_topk_without_ties() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(30, 12, generator=g)
    positions = torch.arange(18, 48)
    ordered = indexer_topk_ordered_ref(scores, positions, ratio=4, top_k=5)
    plain = indexer_topk_ref(scores, positions, ratio=4, top_k=5)
    assert torch.equal(ordered.sort(dim=-1).values, plain.sort(dim=-1).values)
