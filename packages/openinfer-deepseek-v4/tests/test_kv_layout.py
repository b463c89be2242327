"""The paged cache's layout (kv_cache.py): its KV groups and their horizons, where each
compressed entry lives, what a block of each group costs; and the indexer's top-k with ties
given to the earlier entry."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from openinfer_core.interfaces.kv import KVGroupSpec
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.kernels.indexer import indexer_topk_ref
from openinfer_deepseek_v4.kernels.indexer.ordered_topk import indexer_topk_ordered_ref
from openinfer_deepseek_v4.kv_cache import (
    CompressedCache,
    allocate_layers,
    entries_per_block,
    full_bytes_per_block,
    group_bytes_per_block,
    kv_groups,
    token_slots,
)
from openinfer_kvcache import window_pool_blocks

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
    part = CompressedCache(ratio, 1, 0, torch.zeros(blocks, block_size, 1),
                           torch.zeros(blocks, entries_per_block(block_size, ratio), 1))
    entries = torch.arange(len(table) * block_size // ratio)
    slots = part.entry_slots(table, entries)
    assert len(set(slots.tolist())) == len(entries)
    last = token_slots(table, (entries + 1) * ratio - 1, block_size)
    assert torch.equal(slots // part.entries.shape[1], last // block_size)


def test_v4_flash_groups_follow_the_window_and_the_ratios() -> None:
    """The raw entries and HCA projections (ratio 128, no overlap) are read for 128 tokens up
    to the reader, the CSA and indexer projections (ratio 4, overlap: two windows) for 8; the
    entries forever, CSA's in the full group, HCA's in the periodic group of period 128. Each
    layer's parts sit in those groups."""
    cfg = DeepseekV4Config.from_dict(FLASH)
    assert kv_groups(cfg) == (KVGroupSpec("full"), KVGroupSpec("full-128", period=128),
                              KVGroupSpec("window-127", 127), KVGroupSpec("window-7", 7))
    layers = allocate_layers(cfg, (5, 2, 4, 3), 16, torch.bfloat16, torch.device("meta"))
    for kind, layer in zip(cfg.attention_kinds, layers, strict=True):
        assert (layer.kv_group, layer.kv.shape[0]) == (2, 4)
        parts = [p for p in (layer.compressor, layer.indexer) if p is not None]
        assert [(p.projection_group, p.entry_group) for p in parts] == {
            "window": [], "csa": [(3, 0), (3, 0)], "hca": [(2, 1)]}[kind]
        assert all(p.projections.shape[0] == (3 if kind == "csa" else 4) for p in parts)
        assert all(p.entries.shape[0] == (5 if kind == "csa" else 2) for p in parts)


def test_v4_flash_bytes_per_token() -> None:
    """bf16 at block size 16. The full groups (compressed entries and indexer keys): 6,880
    bytes per token, an HCA entry costing 1/128 of one a token in its periodic group (one
    block in 8); 8,000 with a slot per block. Before the groups, every part was kept for
    every token: 200,512."""
    cfg = DeepseekV4Config.from_dict(FLASH)
    full, hca, raw, csa = group_bytes_per_block(cfg, 16, torch.bfloat16)
    assert full == 2 * 21 * (4 * 512 + 4 * 128)
    assert hca == 2 * 20 * 512
    assert full_bytes_per_block(cfg, 16, torch.bfloat16) == full + hca // 8
    assert (full + hca // 8) // 16 == 6880
    assert (full + hca) // 16 == 8000
    assert raw == 2 * (43 * 16 * 512 + 20 * 16 * 2 * 512)  # raw entries, HCA projections
    assert csa == 2 * 21 * (16 * 2 * 1024 + 16 * 2 * 256)  # CSA and indexer projections
    assert (full + hca + raw + csa) // 16 == 200_512
    # a decoding sequence holds at most 9 blocks of the 128-token window and 2 of the 8-token
    # one (the pools for one sequence, the padding block besides): ~15 MB whatever its length
    assert (window_pool_blocks(127, 16, 1, 1), window_pool_blocks(7, 16, 1, 1)) == (10, 3)
    assert raw * 9 + csa * 2 == 15_679_488


def test_v4_flash_bytes_per_token_stored_as_the_official_rounding() -> None:
    """With the official rounding on (DeepSeek's checkpoints) the full groups store their
    codes: an entry 584 bytes (448 e4m3 + 64 bf16 rotary + 7 scale bytes + 1 of padding), an
    indexer key 68 (128 e2m1 + 4 scale bytes): 3,514 bytes per token at any block size up to
    128 (6,880 in bf16), the HCA entries at 584 / 128 bytes a token each; 4,153 at block size
    16 with an HCA slot in every block. The window groups and the layers' other tensors stay in
    bf16, as uint8 rows only the quantized parts."""
    cfg = dataclasses.replace(DeepseekV4Config.from_dict(FLASH), quant_sim=True)
    full, hca, raw, csa = group_bytes_per_block(cfg, 16, torch.bfloat16)
    assert full == 21 * (4 * 584 + 4 * 68)
    assert hca == 20 * 584
    assert (full + hca) // 16 == 4153
    for block_size in (16, 32, 64, 128):
        assert full_bytes_per_block(cfg, block_size, torch.bfloat16) // block_size == 3514
    assert (raw, csa) == tuple(group_bytes_per_block(dataclasses.replace(cfg, quant_sim=False),
                                                     16, torch.bfloat16)[2:])
    layers = allocate_layers(cfg, (5, 2, 4, 3), 16, torch.bfloat16, torch.device("meta"))
    csa_layer = layers[2]
    assert csa_layer.compressor is not None and csa_layer.indexer is not None
    assert csa_layer.compressor.entries.shape == (5, 4, 584)
    assert csa_layer.compressor.entries.dtype == torch.uint8
    assert csa_layer.indexer.entries.shape == (5, 4, 68)
    assert csa_layer.kv.dtype == csa_layer.compressor.projections.dtype == torch.bfloat16


@pytest.mark.parametrize(("ratios", "window", "periods", "horizons"), [
    ([0, 0, 0], 128, (), ()),  # nothing compressed: the raw entries stay in the full group
    ([0, 128, 128], 128, (), (127,)),  # no CSA: the HCA entries in the full group
    ([4, 8, 0], 8, (8,), (7,)),  # every horizon 7: one window group
    ([4, 16, 0], 8, (16,), (15, 7)),
    ([4, 16, 128], 8, (16, 128), (127, 15, 7)),
])
def test_groups_come_from_the_config(ratios: list[int], window: int, periods: tuple[int, ...],
                                     horizons: tuple[int, ...]) -> None:
    cfg = DeepseekV4Config.from_dict(FLASH | {"num_hidden_layers": 3, "sliding_window": window,
                                              "compress_ratios": [*ratios, 0]})
    groups = kv_groups(cfg)
    assert groups[0] == KVGroupSpec("full")
    assert tuple(g.period for g in groups[1:] if g.is_full) == periods
    assert tuple(g.horizon for g in groups[1:] if g.is_window) == horizons


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
