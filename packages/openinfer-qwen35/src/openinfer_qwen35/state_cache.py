"""Qwen3.5's per-request caches: paged K/V for the full-attention layers (the full KV group)
and one fixed-size state slot per request for the Gated DeltaNet layers (the state group:
each linear layer's last `K - 1` convolution inputs and its delta-rule state matrix).

The engine hands out slots through the state group's table (`ForwardBatch.group_table(
STATE_GROUP)`, one entry per row: the slot id; slot 0 is the padding slot, which CUDA-graph
padding rows read and write). A row whose first new token is at position 0 is a request
starting afresh (new, or recomputed after preemption): the model reads zeros for it instead of
the slot's stale contents. Every batch carries the table, start-up's scratch batches included
(their rows may share a slot, whose contents nobody reads back)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from openinfer_core.interfaces.kv import KVGroupSpec
from openinfer_core.interfaces.model import ForwardBatch
from openinfer_qwen35.config import Qwen35Config
from openinfer_qwen35.kernels.gated_delta_rule import chunk_plan

FULL_GROUP = 0  # the attention layers' K/V: `batch.block_tables` and `slot_mapping`
STATE_GROUP = 1  # the linear layers' states: one slot per request
KV_GROUPS = (KVGroupSpec("attention"), KVGroupSpec("linear_state", state=True))


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
    """Each row's state slot [B] and whether it starts afresh [B] bool, for one step, and on
    CUDA prefill steps the delta rule's chunk plan (`chunk_plan`), which every linear layer
    of the step shares."""

    slots: torch.Tensor
    fresh: torch.Tensor
    plan: Any = None

    @classmethod
    def of(cls, batch: ForwardBatch) -> StepRows:
        """A row with no tokens (a mixed CUDA graph's padding row, on the padding slot) reads
        the position of the token after the step's, padding at position 0 too, or the last
        token's: either way it only touches slot 0."""
        if len(batch.group_block_tables) <= STATE_GROUP:
            raise RuntimeError("a Qwen3.5 step without its state group's table: the engine "
                               "passes every KV group's table with a state group")
        slots = batch.group_table(STATE_GROUP)[:, 0]
        first = batch.query_start_loc[:-1].long().clamp(max=max(batch.num_tokens - 1, 0))
        plan = chunk_plan(batch.query_start_loc, batch.query_start_loc_cpu,
                          decode=batch.max_query_len == 1)
        return cls(slots.long(), batch.positions[first] == 0, plan)
