"""DeepSeek-V4's KV cache in the engine's paged blocks. Every layer shares one block table per
request (so the block manager and its prefix cache are the standard ones), and a block of
`block_size` tokens holds, per layer, everything a later step needs from those tokens:

- `kv`: each token's raw entry (key = value, one head), read by the sliding window;
- compressed layers, for the main compressor and (CSA) the indexer's: each token's compressor
  projections (x W_kv^T | x W_gate^T, before the pooling), and each compressed entry, kept in
  the block that holds its window's last token ((j + 1) * ratio - 1).

So a step needs no state beyond the blocks: a window's entry is pooled, in the step that computes
its last token, from projections already in the cache; chunked prefill, preemption by recompute
and prefix-cache hits need nothing more. (Spec: shared deepseek-v4.md §5.5, §5.8.)"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from openinfer_deepseek_v4.config import DeepseekV4Config


def entries_per_block(block_size: int, ratio: int) -> int:
    """Compressed entries that can end in one block: ceil(block_size / ratio) (1 when a window
    is longer than a block)."""
    return -(-block_size // ratio)


@dataclass(slots=True)
class CompressedCache:
    """One compressor's part of a layer's blocks."""

    ratio: int
    projections: torch.Tensor  # [blocks, block_size, 2 c d]: kv | gate projections per token
    entries: torch.Tensor  # [blocks, entries_per_block, d]

    def entry_slots(self, table: torch.Tensor, entries: torch.Tensor) -> torch.Tensor:
        """Flat slots (rows of `entries.flatten(0, 1)`) of entries j (`entries`) of the request
        with block table `table`: in the block of token (j + 1) * ratio - 1."""
        block_size = self.projections.shape[1]
        last = (entries + 1) * self.ratio - 1
        return (table[last // block_size].long() * self.entries.shape[1]
                + (last % block_size) // self.ratio)


@dataclass(slots=True)
class LayerCache:
    kv: torch.Tensor  # [blocks, block_size, head_dim]
    compressor: CompressedCache | None  # CSA and HCA layers
    indexer: CompressedCache | None  # CSA layers

    def tensors(self) -> list[torch.Tensor]:
        out = [self.kv]
        for part in (self.compressor, self.indexer):
            if part is not None:
                out += [part.projections, part.entries]
        return out


def token_slots(table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat token slots (rows of a [blocks, block_size, ...] tensor flattened) of `positions`
    in the request with block table `table`."""
    return table[positions // block_size].long() * block_size + positions % block_size


def _layer_shapes(cfg: DeepseekV4Config, layer: int,
                  block_size: int) -> dict[str, tuple[int, ...]]:
    """Per block, the shape of each of the layer's tensors."""
    kind, ratio = cfg.attention_kinds[layer], cfg.compress_ratios[layer]
    shapes: dict[str, tuple[int, ...]] = {"kv": (block_size, cfg.head_dim)}
    if kind != "window":
        overlap = 2 if kind == "csa" else 1
        slots = entries_per_block(block_size, ratio)
        shapes["compressor.projections"] = (block_size, 2 * overlap * cfg.head_dim)
        shapes["compressor.entries"] = (slots, cfg.head_dim)
        if kind == "csa":
            shapes["indexer.projections"] = (block_size, 2 * 2 * cfg.index_head_dim)
            shapes["indexer.entries"] = (slots, cfg.index_head_dim)
    return shapes


def kv_bytes_per_block(cfg: DeepseekV4Config, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return element * sum(math.prod(shape) for layer in range(cfg.num_layers)
                         for shape in _layer_shapes(cfg, layer, block_size).values())


def allocate_layers(cfg: DeepseekV4Config, num_blocks: int, block_size: int,
                    dtype: torch.dtype, device: torch.device) -> list[LayerCache]:
    """Zeroed caches of `num_blocks` blocks per layer (block 0, the padding block, included)."""
    layers = []
    for layer in range(cfg.num_layers):
        shapes = _layer_shapes(cfg, layer, block_size)
        t = {name: torch.zeros((num_blocks, *shape), dtype=dtype, device=device)
             for name, shape in shapes.items()}
        ratio = cfg.compress_ratios[layer]
        parts = [CompressedCache(ratio, t[f"{p}.projections"], t[f"{p}.entries"])
                 if f"{p}.entries" in t else None for p in ("compressor", "indexer")]
        layers.append(LayerCache(t["kv"], *parts))
    return layers
