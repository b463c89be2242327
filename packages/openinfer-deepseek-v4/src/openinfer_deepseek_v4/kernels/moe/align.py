"""Routing for the grouped expert GEMMs: the (token, slot) pairs sorted by expert and cut into
tiles of `block_m` rows, each tile one expert's. Plain torch ops on the device, sized from
shapes alone (no host sync), so a decode step that routes this way can be captured in a CUDA
graph; tiles past the last real one are marked expert -1 and their programs exit at once.
Pairs of id -1 (another rank's expert, under expert parallelism) go to one more bucket after
the experts, numbered `num_experts`: its tiles compute nothing, and the down product writes
their rows as zeros."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ExpertTiles:
    """pair: [P] int32, the pair indices (token * k + slot) in expert order (stable: within an
    expert, token order). tile_expert / tile_start / tile_rows: [max_tiles] int32, a tile's
    expert (-1: no tile; num_experts: pairs of id -1), its first row in `pair` and its row
    count (<= block_m)."""

    pair: torch.Tensor
    tile_expert: torch.Tensor
    tile_start: torch.Tensor
    tile_rows: torch.Tensor
    block_m: int


def max_tiles(pairs: int, num_experts: int, block_m: int) -> int:
    """An upper bound on the tiles of any routing over `num_experts` buckets: each used one
    wastes under one tile."""
    return min(pairs, num_experts) + -(-pairs // block_m)


def align_by_expert(ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertTiles:
    """ids [T, k] (expert indices in [0, num_experts), or -1; not checked, that would sync)
    -> the tiles of the pairs that picked each expert, in expert order, then those of -1."""
    flat = ids.flatten().long()
    flat = torch.where(flat < 0, num_experts, flat)
    buckets = num_experts + 1
    pairs = flat.numel()
    pair = torch.argsort(flat, stable=True).to(torch.int32)
    counts = torch.zeros(buckets, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # integer adds: order-independent
    tiles = (counts + block_m - 1) // block_m
    tile_end = torch.cumsum(tiles, 0)
    row_end = torch.cumsum(counts, 0)
    t = torch.arange(max_tiles(pairs, buckets, block_m), device=ids.device)
    expert = torch.searchsorted(tile_end, t, right=True)
    real = expert < buckets
    e = expert.clamp(max=buckets - 1)
    start = row_end[e] - counts[e] + (t - (tile_end[e] - tiles[e])) * block_m
    rows = torch.clamp(row_end[e] - start, max=block_m)
    return ExpertTiles(pair=pair,
                       tile_expert=torch.where(real, e, -1).to(torch.int32),
                       tile_start=torch.where(real, start, 0).to(torch.int32),
                       tile_rows=torch.where(real, rows, 0).to(torch.int32),
                       block_m=block_m)
