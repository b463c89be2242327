"""`StepSlots`: a step's slot arithmetic, made once and shared by its layers (`paged_attention`
steps 1 and 3), in each KV group's pool (`kv_cache`). Spec: shared deepseek-v4.md §5.5."""

from __future__ import annotations

import torch

from openinfer_core.interfaces.model import ForwardBatch
from openinfer_deepseek_v4.kernels.indexer import paged_entry_slots, token_requests
from openinfer_deepseek_v4.reference import window_positions


class StepSlots:
    """The slot arithmetic of one step that every layer would repeat alike: each token's
    request, its slot in each KV group's pool, each query's window of raw-entry slots, the
    compressed-entry slots a query sees (HCA), the entries the step closes (rounded where the
    model rounds them). Made when a layer first asks, then shared by the step's other layers
    (a forward makes one; on the GPU each is a few small torch ops, captured with the step).
    Reads the batch only.

    Group 0 is the full group, whose table is `batch.block_tables` and whose slots are
    `batch.slot_mapping`; a window group's come from `batch.group_table(g)` (which is
    `block_tables` in a batch without group tables: start-up's scratch steps)."""

    def __init__(self, batch: ForwardBatch, block_size: int) -> None:
        self.batch = batch
        self.block_size = block_size
        self._requests: torch.Tensor | None = None
        self._tokens: dict[int, torch.Tensor] = {}
        self._windows: dict[tuple[int, int], torch.Tensor] = {}
        self._visible: dict[tuple[int, int, int], torch.Tensor] = {}
        self._closed: dict[tuple[int, int, int], torch.Tensor] = {}

    @property
    def requests(self) -> torch.Tensor:
        """[T] int32: each token's request (row of the block tables)."""
        if self._requests is None:
            self._requests = token_requests(self.batch.query_start_loc,
                                            int(self.batch.positions.shape[0]))
        return self._requests

    def token_slots(self, group: int) -> torch.Tensor:
        """[T]: each token's slot in group `group`'s pool (rows of a [blocks, block_size, ...]
        tensor flattened), where the step writes what the token leaves there. A padding token
        (a CUDA graph's, whose full-group slot is in the padding block 0) writes into block 0
        of every group: its request row may be another's, or stale."""
        if group == 0:
            return self.batch.slot_mapping
        if group not in self._tokens:
            batch, block_size = self.batch, self.block_size
            blocks = batch.group_table(group).long()[self.requests.long(),
                                                     batch.positions // block_size]
            slots = blocks * block_size + batch.positions % block_size
            padding = batch.slot_mapping < block_size
            self._tokens[group] = torch.where(padding, batch.slot_mapping, slots)
        return self._tokens[group]

    def window(self, size: int, group: int) -> torch.Tensor:
        """[T, size] int32: the raw-entry slots, in group `group`'s pool, of each query's
        sliding window (-1 before position 0)."""
        if (size, group) not in self._windows:
            batch, block_size = self.batch, self.block_size
            window, real = window_positions(batch.positions, size)
            blocks = batch.group_table(group).long()[self.requests.long()[:, None],
                                                     window // block_size]
            self._windows[size, group] = torch.where(
                real, blocks * block_size + window % block_size, -1).to(torch.int32)
        return self._windows[size, group]

    def visible_entries(self, ratio: int, slots_per_block: int, group: int) -> torch.Tensor:
        """[T, max_seq_len // ratio] int32: the slots, in full group `group`'s pool, of every
        compressed entry each query sees (entries j < (position + 1) // ratio; -1 past them).
        The width follows the step's host bound, never device values."""
        key = (ratio, slots_per_block, group)
        if key not in self._visible:
            batch = self.batch
            entries = torch.arange(batch.max_seq_len // ratio, device=batch.positions.device)
            entries = entries.expand(batch.positions.shape[0], -1)
            entries = torch.where(entries < ((batch.positions + 1) // ratio)[:, None], entries,
                                  -1)
            self._visible[key] = paged_entry_slots(
                batch.group_table(group), self.requests, entries, ratio=ratio,
                block_size=self.block_size, slots_per_block=slots_per_block)
        return self._visible[key]

    def closed_entries(self, ratio: int, slots_per_block: int, group: int) -> torch.Tensor:
        """[T] int32: for each token that closes a compressed entry (its position + 1 a
        multiple of `ratio`), that entry's slot in full group `group`'s pool; -1 for the
        others."""
        key = (ratio, slots_per_block, group)
        if key not in self._closed:
            batch = self.batch
            closes = (batch.positions + 1) % ratio == 0
            entry = torch.where(closes, (batch.positions + 1) // ratio - 1, -1)
            slots = paged_entry_slots(batch.group_table(group), self.requests, entry[:, None],
                                      ratio=ratio, block_size=self.block_size,
                                      slots_per_block=slots_per_block)
            self._closed[key] = slots[:, 0]
        return self._closed[key]
