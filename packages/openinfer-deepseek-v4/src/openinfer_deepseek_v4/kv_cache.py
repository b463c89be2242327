"""DeepSeek-V4's KV cache in the engine's paged blocks, in KV groups (openinfer-kvcache's
README, "KV groups"). All groups share the block size and the positions: block i of every
group's table holds what tokens [i * block_size, (i + 1) * block_size) left, per layer:

- `kv`: each token's raw entry (key = value, one head), read by the sliding window of the
  `sliding_window` tokens up to the reader: a window group of horizon sliding_window - 1;
- compressed layers, for the main compressor and (CSA) the indexer's: each token's compressor
  projections (x W_kv^T | x W_gate^T, before the pooling), read only while their window is
  open. The token closing window j, at p = (j + 1) ratio - 1, pools its window's tokens
  [p - ratio + 1, p], and with overlap (CSA) window j - 1's too, [p - 2 ratio + 1, p]: a window
  group of horizon ratio - 1, or 2 ratio - 1 with overlap;
- and each compressed entry (the indexer's are its keys), read by every later token: a full
  group, kept in the block that holds its window's last token ((j + 1) * ratio - 1), whose
  prefix hash covers every token the entry depends on. The entries of the smallest ratio (CSA's
  4) are in the plain full group; each longer ratio r (HCA's 128) has a periodic full group of
  period r (`KVGroupSpec.period`), which holds a block only where one closes a window: with r
  above the block size, 1 block in r / block_size, so its entries cost 1 / r of one a token.

The full group is first (`kv_groups`), then the periodic ones (`full-128` at V4-Flash's widths),
then one window group per distinct horizon (`window-127`: raw entries and HCA projections;
`window-7`: CSA and indexer projections). A config without compressed layers has nothing to keep
in full: its raw entries stay in the one full group. So a step needs no state beyond the blocks:
a window's entry is pooled, in the step that computes its last token, from projections already
in the cache; chunked prefill, preemption by recompute and prefix-cache hits need nothing more.

With the official rounding on (`cfg.quant_sim`) the full groups store what the rounding keeps
(`entry_formats`): the main entries in FP8 with their scales, the indexer keys in FP4
(`kernels/quant_sim/storage.py`), written by `compress_pool` and decoded by their readers.
(Spec: shared deepseek-v4.md §5.5, §5.8.)"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from openinfer_core.interfaces.kv import KVGroupSpec
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.kernels.quant_sim.storage import Fp4Keys, Fp8Entries, RowFormat

FULL = KVGroupSpec("full")


def entries_per_block(block_size: int, ratio: int) -> int:
    """Compressed entries that can end in one block: ceil(block_size / ratio) (1 when a window
    is longer than a block)."""
    return -(-block_size // ratio)


@dataclass(frozen=True, slots=True)
class _Part:
    """One tensor of a layer: its name, the group it lives in, its shape per block and its row
    format (None: the model's dtype; else uint8 rows)."""

    name: str
    group: KVGroupSpec
    shape: tuple[int, ...]
    fmt: RowFormat | None = None


def _window(horizon: int) -> KVGroupSpec:
    return KVGroupSpec(f"window-{horizon}", horizon)


def _entry_group(cfg: DeepseekV4Config, ratio: int) -> KVGroupSpec:
    """The full group of the compressed entries of `ratio`: the plain one for the smallest
    ratio, a periodic one for each other."""
    smallest = min(r for r, k in zip(cfg.compress_ratios, cfg.attention_kinds, strict=True)
                   if k != "window")
    return FULL if ratio == smallest else KVGroupSpec(f"full-{ratio}", period=ratio)


def entry_formats(cfg: DeepseekV4Config, dtype: torch.dtype
                  ) -> tuple[Fp8Entries | None, Fp4Keys | None]:
    """How the full group stores the main compressed entries and the indexer keys: with the
    official rounding on, as its codes (FP8 entries, FP4 keys); else (None, None), in
    `dtype`."""
    if not cfg.quant_sim:
        return None, None
    element = torch.empty((), dtype=dtype).element_size()
    return (Fp8Entries(cfg.head_dim, cfg.rope_head_dim, element),
            Fp4Keys(cfg.index_head_dim))


def _layer_parts(cfg: DeepseekV4Config, layer: int, block_size: int,
                 dtype: torch.dtype = torch.bfloat16) -> list[_Part]:
    kind, ratio = cfg.attention_kinds[layer], cfg.compress_ratios[layer]
    compressed = any(k != "window" for k in cfg.attention_kinds)
    parts = [_Part("kv", _window(cfg.sliding_window - 1) if compressed else FULL,
                   (block_size, cfg.head_dim))]
    if kind != "window":
        overlap = 2 if kind == "csa" else 1
        window, full = _window(overlap * ratio - 1), _entry_group(cfg, ratio)
        slots = entries_per_block(block_size, ratio)
        entries, keys = entry_formats(cfg, dtype)
        parts += [_Part("compressor.projections", window,
                        (block_size, 2 * overlap * cfg.head_dim)),
                  _Part("compressor.entries", full,
                        (slots, cfg.head_dim if entries is None else entries.row_bytes),
                        entries)]
        if kind == "csa":
            parts += [_Part("indexer.projections", window,
                            (block_size, 2 * 2 * cfg.index_head_dim)),
                      _Part("indexer.entries", full,
                            (slots, cfg.index_head_dim if keys is None else keys.row_bytes),
                            keys)]
    return parts


def kv_groups(cfg: DeepseekV4Config) -> tuple[KVGroupSpec, ...]:
    """The full group, the periodic full groups by period, then a window group per distinct
    horizon, longest first."""
    groups = {p.group for layer in range(cfg.num_layers) for p in _layer_parts(cfg, layer, 1)}
    periodic = sorted((g for g in groups if g.period > 1), key=lambda g: g.period)
    windows = sorted((g for g in groups if g.is_window), key=lambda g: -(g.horizon or 0))
    return (FULL, *periodic, *windows)


def group_bytes_per_block(cfg: DeepseekV4Config, block_size: int,
                          dtype: torch.dtype) -> tuple[int, ...]:
    """Bytes one block of each group (`kv_groups` order) holds, every layer's parts in it
    (the quantized rows, `entry_formats`, one byte an element)."""
    element = torch.empty((), dtype=dtype).element_size()
    out = dict.fromkeys(kv_groups(cfg), 0)
    for layer in range(cfg.num_layers):
        for part in _layer_parts(cfg, layer, block_size, dtype):
            out[part.group] += (element if part.fmt is None else 1) * math.prod(part.shape)
    return tuple(out.values())


def full_bytes_per_block(cfg: DeepseekV4Config, block_size: int, dtype: torch.dtype) -> int:
    """What one block of the full group costs (`Model.kv_bytes_per_block`): its own bytes and
    each periodic group's share, block_size / period of one of its blocks where the period is
    longer than a block (`openinfer_kvcache.periodic_pool_blocks`; the pool's fixed part, a
    block per running request, is counted with the window pools)."""
    total = 0
    for group, size in zip(kv_groups(cfg), group_bytes_per_block(cfg, block_size, dtype),
                           strict=True):
        if group.is_full:
            total += size if group.period <= block_size else -(-size * block_size
                                                               // group.period)
    return total


@dataclass(slots=True)
class CompressedCache:
    """One compressor's part of a layer's blocks: the projections in a window group's pool,
    the entries in a full group's (plain or periodic)."""

    ratio: int
    projection_group: int  # the projections' group (index in `kv_groups`)
    entry_group: int  # the entries' full group (index in `kv_groups`)
    projections: torch.Tensor  # [window blocks, block_size, 2 c d]: kv | gate per token
    # [full blocks, entries_per_block, d], or with `fmt` [.., fmt.row_bytes] uint8 rows
    entries: torch.Tensor
    fmt: RowFormat | None = None

    def entry_slots(self, table: torch.Tensor, entries: torch.Tensor) -> torch.Tensor:
        """Flat slots (rows of `entries.flatten(0, 1)`) of entries j (`entries`) of the request
        with block table `table` (of `entry_group`): in the block of token (j + 1) * ratio - 1."""
        block_size = self.projections.shape[1]
        last = (entries + 1) * self.ratio - 1
        return (table[last // block_size].long() * self.entries.shape[1]
                + (last % block_size) // self.ratio)


@dataclass(slots=True)
class LayerCache:
    kv_group: int  # the raw entries' group (index in `kv_groups`)
    kv: torch.Tensor  # [blocks of kv_group, block_size, head_dim]
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


def allocate_layers(cfg: DeepseekV4Config, pool_blocks: tuple[int, ...], block_size: int,
                    dtype: torch.dtype, device: torch.device) -> list[LayerCache]:
    """Zeroed caches per layer, each part with its group's pool of `pool_blocks[g]` blocks
    (`kv_groups` order; block 0, the padding block, included)."""
    group_of = {g: i for i, g in enumerate(kv_groups(cfg))}
    layers = []
    for layer in range(cfg.num_layers):
        parts = {p.name: p for p in _layer_parts(cfg, layer, block_size, dtype)}
        t = {name: torch.zeros((pool_blocks[group_of[p.group]], *p.shape),
                               dtype=dtype if p.fmt is None else torch.uint8, device=device)
             for name, p in parts.items()}
        ratio = cfg.compress_ratios[layer]
        caches = [CompressedCache(ratio, group_of[parts[f"{c}.projections"].group],
                                  group_of[parts[f"{c}.entries"].group],
                                  t[f"{c}.projections"], t[f"{c}.entries"],
                                  parts[f"{c}.entries"].fmt)
                  if f"{c}.entries" in t else None for c in ("compressor", "indexer")]
        layers.append(LayerCache(group_of[parts["kv"].group], t["kv"], *caches))
    return layers
