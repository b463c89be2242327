"""Qwen3.5's per-request caches: paged K/V for the full-attention layers (the full KV group)
and one fixed-size state slot per request for the Gated DeltaNet layers (the state group:
each linear layer's last `K - 1` convolution inputs and its delta-rule state matrix).

The engine hands out slots through the state group's table (`ForwardBatch.group_table(
STATE_GROUP)`, one entry per row: the slot id; slot 0 is the padding slot). A row whose first
new token is at position 0 is a request starting afresh (new, or recomputed after
preemption): the model reads zeros for it instead of the slot's stale contents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from openinfer_core.interfaces.kv import KVGroupSpec
from openinfer_core.interfaces.model import ForwardBatch
from openinfer_qwen35.config import Qwen35Config

FULL_GROUP = 0  # the attention layers' K/V: `batch.block_tables` and `slot_mapping`
STATE_GROUP = 1
# Start-up's scratch caches (no step limits) hold at most this many slots, padding included:
# a slot is megabytes (Qwen3.5-4B: ~50 MB), so never one per scratch block.
SCRATCH_SLOTS = 9


def kv_groups() -> tuple[KVGroupSpec, ...]:
    """The full group, then the state group (`KVGroupSpec.state`)."""
    # `state` is given through a mapping so that this also type-checks against a
    # KVGroupSpec declared without the field.
    state: dict[str, Any] = {"state": True}
    return (KVGroupSpec("attention"), KVGroupSpec("linear_state", **state))


@dataclass(slots=True)
class StateCache:
    """Every linear layer's state, by slot: `conv` [layers, slots, conv_dim, K - 1] in the
    model's dtype, `recurrent` [layers, slots, value_heads, key_dim, value_dim] in fp32 (the
    delta rule accumulates over the whole sequence)."""

    conv: torch.Tensor
    recurrent: torch.Tensor

    @classmethod
    def allocate(cls, cfg: Qwen35Config, num_slots: int, dtype: torch.dtype,
                 device: torch.device) -> StateCache:
        layers = len(cfg.linear_layers)
        return cls(
            torch.zeros(layers, num_slots, cfg.conv_dim, cfg.conv_kernel - 1, dtype=dtype,
                        device=device),
            torch.zeros(layers, num_slots, cfg.linear_value_heads, cfg.linear_key_dim,
                        cfg.linear_value_dim, dtype=torch.float32, device=device))

    @property
    def num_slots(self) -> int:
        return int(self.conv.shape[1])

    @staticmethod
    def bytes_per_slot(cfg: Qwen35Config, dtype: torch.dtype) -> int:
        layers = len(cfg.linear_layers)
        conv = cfg.conv_dim * (cfg.conv_kernel - 1) * dtype.itemsize
        recurrent = cfg.linear_value_heads * cfg.linear_key_dim * cfg.linear_value_dim * 4
        return layers * (conv + recurrent)


@dataclass(frozen=True, slots=True)
class StepRows:
    """Each row's state slot [B] and whether it starts afresh [B] bool, for one step."""

    slots: torch.Tensor
    fresh: torch.Tensor

    @classmethod
    def of(cls, batch: ForwardBatch, num_slots: int) -> StepRows:
        rows = batch.num_seqs
        if batch.group_block_tables:
            slots = batch.group_table(STATE_GROUP)[:, 0]
        else:
            # Start-up's scratch batches carry no group tables: rows take slots 1.. in turn.
            slots = torch.arange(rows, device=batch.input_ids.device) % (num_slots - 1) + 1
        first = batch.query_start_loc[:-1].long().clamp(max=max(batch.num_tokens - 1, 0))
        return cls(slots.long(), batch.positions[first] == 0)
