"""A step's slot arithmetic in torch ops (the model's `StepSlots` on CPU, and the Triton
kernels' oracle): each token's slot in a window group's pool, each query's window of raw-entry
slots, and the compressed entries' slots, all in int tensors on the batch's device. Spec:
shared deepseek-v4.md §5.5."""

from __future__ import annotations

import torch

from openinfer_deepseek_v4.kernels.indexer.reference import paged_entry_slots


def token_slots_ref(table: torch.Tensor, requests: torch.Tensor, positions: torch.Tensor,
                    slot_mapping: torch.Tensor, block_size: int) -> torch.Tensor:
    """[T] int64: each token's slot in the pool of the group whose block tables are `table`
    ([B, max_blocks]; `requests` [T] the tokens' rows of it); a padding token's (full-group
    slot in block 0) is its full-group slot."""
    blocks = table.long()[requests.long(), positions // block_size]
    slots = blocks * block_size + positions % block_size
    return torch.where(slot_mapping < block_size, slot_mapping, slots)


def window_slots_ref(table: torch.Tensor, requests: torch.Tensor, positions: torch.Tensor,
                     size: int, block_size: int) -> torch.Tensor:
    """[T, size] int32: the raw-entry slots of each query's sliding window, positions
    t - size + 1 .. t, in the pool of `table`'s group; -1 before position 0."""
    window = positions[:, None] - size + 1 + torch.arange(size, device=positions.device)
    real = window >= 0
    window = window.clamp(min=0)
    blocks = table.long()[requests.long()[:, None], window // block_size]
    return torch.where(real, blocks * block_size + window % block_size, -1).to(torch.int32)


def visible_entry_slots_ref(table: torch.Tensor, requests: torch.Tensor,
                            positions: torch.Tensor, width: int, *, ratio: int,
                            block_size: int, slots_per_block: int) -> torch.Tensor:
    """[T, width] int32: the slots of the compressed entries each query sees (entries
    j < (position + 1) // ratio), -1 past them (`paged_entry_slots`)."""
    entries = torch.arange(width, device=positions.device).expand(positions.shape[0], -1)
    entries = torch.where(entries < ((positions + 1) // ratio)[:, None], entries, -1)
    return paged_entry_slots(table, requests, entries, ratio=ratio, block_size=block_size,
                             slots_per_block=slots_per_block)


def closed_entry_slots_ref(table: torch.Tensor, requests: torch.Tensor,
                           positions: torch.Tensor, *, ratio: int, block_size: int,
                           slots_per_block: int) -> torch.Tensor:
    """[T] int32: for each token that closes a compressed entry (position + 1 a multiple of
    `ratio`), that entry's slot; -1 for the others."""
    closes = (positions + 1) % ratio == 0
    entry = torch.where(closes, (positions + 1) // ratio - 1, -1)
    return paged_entry_slots(table, requests, entry[:, None], ratio=ratio,
                             block_size=block_size, slots_per_block=slots_per_block)[:, 0]
