"""`StepSlots`: a step's slot arithmetic, made once and shared by its layers (`paged_attention`
steps 1 and 3), in each KV group's pool (`kv_cache`). Spec: shared deepseek-v4.md §5.5."""

from __future__ import annotations

import torch

from openinfer_core.interfaces.model import ForwardBatch
from openinfer_deepseek_v4.kernels.slots import (
    closed_entry_slots,
    token_requests,
    token_slots,
    visible_entry_slots,
    window_slots,
)


class StepSlots:
    """The slot arithmetic of one step that every layer would repeat alike: each token's
    request, its slot in each KV group's pool, each query's window of raw-entry slots, the
    compressed-entry slots a query sees (HCA), the entries the step closes (rounded where the
    model rounds them). Made when a layer first asks, then shared by the step's other layers
    (a forward makes one; on the GPU each is one launch of kernels/slots, captured with the
    step). Reads the batch only.

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
            batch = self.batch
            self._tokens[group] = token_slots(batch.group_table(group), self.requests,
                                              batch.positions, batch.slot_mapping,
                                              self.block_size)
        return self._tokens[group]

    def window(self, size: int, group: int) -> torch.Tensor:
        """[T, size] int32: the raw-entry slots, in group `group`'s pool, of each query's
        sliding window (-1 before position 0)."""
        if (size, group) not in self._windows:
            batch = self.batch
            self._windows[size, group] = window_slots(batch.group_table(group), self.requests,
                                                      batch.positions, size, self.block_size)
        return self._windows[size, group]

    def visible_entries(self, ratio: int, slots_per_block: int, group: int) -> torch.Tensor:
        """[T, max_seq_len // ratio] int32: the slots, in full group `group`'s pool, of every
        compressed entry each query sees (entries j < (position + 1) // ratio; -1 past them).
        The width follows the step's host bound, never device values."""
        key = (ratio, slots_per_block, group)
        if key not in self._visible:
            batch = self.batch
            self._visible[key] = visible_entry_slots(
                batch.group_table(group), self.requests, batch.positions,
                batch.max_seq_len // ratio, ratio=ratio, block_size=self.block_size,
                slots_per_block=slots_per_block)
        return self._visible[key]

    def closed_entries(self, ratio: int, slots_per_block: int, group: int) -> torch.Tensor:
        """[T] int32: for each token that closes a compressed entry (its position + 1 a
        multiple of `ratio`), that entry's slot in full group `group`'s pool; -1 for the
        others."""
        key = (ratio, slots_per_block, group)
        if key not in self._closed:
            self._closed[key] = closed_entry_slots(
                self.batch.group_table(group), self.requests, self.batch.positions, ratio=ratio,
                block_size=self.block_size, slots_per_block=slots_per_block)
        return self._closed[key]
