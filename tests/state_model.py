"""A test-only hybrid model line: a recurrent state per request in a state KV group beside a
full group, as a linear-attention layer keeps one beside attention layers' paged KV.

Each request's state is a running hash of every token it has seen, folded in order
(`fold`), kept in its slot and updated in place each step; the full group keeps each token's
id per position. The next token depends on both: the state and the sum of every earlier token
(read through the full group's table). So a state that is missing, reset, stale or another
request's changes the output, which `expected_tokens` predicts by recomputing from the whole
history. Strict, to fail loudly where the engine gets the state group wrong: every batch
carries the groups' tables, a state table is one slot per row, no real row uses the padding
slot or another row's slot, and a row continues its slot's state exactly where the last step
left it (or, at position 0, starts afresh)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from openinfer_core.distributed import TensorParallelModel
from openinfer_core.hookspecs import hookimpl
from openinfer_core.interfaces.kv import KVGroupSpec, KVManager, KVStepLimits
from openinfer_core.interfaces.model import ForwardBatch, LoadOptions
from openinfer_core.registry import RegisterModel
from openinfer_kvcache import GroupedKVManager, group_pool_blocks

ARCHITECTURE = "StateHistoryForCausalLM"
TOKEN_BYTES = 8  # one int64 per position in the full group
STATE_BYTES = 16  # per slot: the hash and the number of tokens folded into it
MODULUS = 1_000_003


def fold(state: int, token: int) -> int:
    """The state after one more token: order matters, so a token folded twice, missed or
    folded out of turn gives another state."""
    return (state * 31 + token + 1) % MODULUS


def next_token(tokens: Sequence[int], vocab_size: int) -> int:
    """What the model predicts after `tokens`: their folded state plus their sum."""
    state = 0
    for t in tokens:
        state = fold(state, t)
    return (state + sum(tokens)) % vocab_size


def expected_tokens(prompt: Sequence[int], n: int, vocab_size: int) -> list[int]:
    """The recompute reference: each token predicted from the whole history."""
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(next_token(tokens, vocab_size))
    return tokens[len(prompt):]


class StateHistoryModel:
    """Group 0 is the state group ("state"), group 1 the full group ("full"). `state[slot]` is
    (hash, tokens folded); `history[block, offset]` a token id. `state_slots`, when set,
    overrides the state pool's size (to make admission wait for slots)."""

    def __init__(self, vocab_size: int, max_model_len: int, device: torch.device,
                 state_slots: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.device = device
        self.state_slots = state_slots
        self.kv_groups = (KVGroupSpec("state", state=True), KVGroupSpec("full"))
        self.history = torch.zeros(0, 1, dtype=torch.int64)
        self.state = torch.zeros(0, 2, dtype=torch.int64)
        self.pool_blocks: tuple[int, ...] = ()
        self.max_rows = 0  # the most rows any step ran

    def kv_bytes_per_block(self, block_size: int) -> int:
        return TOKEN_BYTES * block_size

    def kv_window_bytes(self, block_size: int, limits: KVStepLimits) -> int:
        return STATE_BYTES * self._pools(0, block_size, limits)[0]

    def _pools(self, num_blocks: int, block_size: int,
               limits: KVStepLimits | None) -> tuple[int, ...]:
        pools = group_pool_blocks(self.kv_groups, num_blocks, block_size, limits)
        if self.state_slots is not None and limits is not None:
            pools = (self.state_slots, *pools[1:])
        return pools

    def create_kv_cache(self, num_blocks: int, block_size: int,
                        limits: KVStepLimits | None = None) -> KVManager:
        self.pool_blocks = self._pools(num_blocks, block_size, limits)
        self.state = torch.zeros(self.pool_blocks[0], 2, dtype=torch.int64)
        self.history = torch.zeros(num_blocks, block_size, dtype=torch.int64)
        return GroupedKVManager(self.kv_groups, self.pool_blocks, block_size)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if len(batch.group_block_tables) != 2 or batch.group_table(1) is not batch.block_tables:
            raise AssertionError("a step without its KV groups' block tables")
        slots = batch.group_table(0)
        rows = batch.num_seqs
        if tuple(slots.shape) != (rows, 1):
            raise AssertionError(f"a state table of shape {tuple(slots.shape)} for {rows} rows")
        slot_ids = slots[:, 0].tolist()
        if 0 in slot_ids or len(set(slot_ids)) != rows:
            raise AssertionError(f"rows on the padding slot or sharing one: {slot_ids}")
        self.max_rows = max(self.max_rows, rows)
        self.history.view(-1)[batch.slot_mapping] = batch.input_ids
        starts = batch.query_start_loc.tolist()
        ids, positions = batch.input_ids.tolist(), batch.positions.tolist()
        after: dict[int, int] = {}  # token index -> the state after it
        for row, slot in enumerate(slot_ids):
            lo, hi = starts[row], starts[row + 1]
            if positions[lo] == 0:
                self.state[slot] = 0  # a fresh request: the model zeroes its slot
            state, seen = self.state[slot].tolist()
            if seen != positions[lo]:
                raise AssertionError(f"slot {slot} holds the state of {seen} tokens, its row "
                                     f"starts at position {positions[lo]}")
            for i in range(lo, hi):
                state = fold(state, ids[i])
                after[i] = state
            self.state[slot] = torch.tensor([state, seen + hi - lo])
        logits = torch.zeros(len(batch.logits_indices), self.vocab_size)
        for j, token in enumerate(batch.logits_indices.tolist()):
            row = next(b for b in range(rows) if starts[b] <= token < starts[b + 1])
            p = positions[token]
            size = self.history.shape[1]
            at = torch.arange(p + 1)
            seen_ids = self.history[batch.block_tables[row][at // size].long(), at % size]
            logits[j, (after[token] + int(seen_ids.sum())) % self.vocab_size] = 10.0
        return logits


class StateLine:
    name: ClassVar[str] = "state-history"
    supports_tensor_parallel: ClassVar[Literal[True]] = True

    @classmethod
    def load(cls, model_dir: Path, config: dict[str, Any],
             options: LoadOptions) -> StateHistoryModel:
        slots = config.get("state_slots")
        return StateHistoryModel(int(config["vocab_size"]), options.max_model_len or 256,
                                 options.device, int(slots) if slots is not None else None)


class StateTP2:
    """The same line over 2 ranks (every rank runs the whole model: only rank 0's logits
    count, but a rank whose tables or states are wrong fails its forward)."""

    name: ClassVar[str] = "state-history-tp2"

    @classmethod
    def load(cls, model_dir: Path, config: dict[str, Any],
             options: LoadOptions) -> TensorParallelModel:
        return TensorParallelModel.start(StateLine, model_dir, config, options, 2,
                                         timeout_s=30.0)


class StatePlugin:
    def __init__(self, ranks: int = 1) -> None:
        self.target = "state_model:StateLine" if ranks == 1 else "state_model:StateTP2"

    @hookimpl
    def openinfer_register_models(self, register: RegisterModel) -> None:
        register("state-history", self.target, architectures=(ARCHITECTURE,))


def write_checkpoint(dest: Path, *, vocab_size: int = 997,
                     state_slots: int | None = None) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {"architectures": [ARCHITECTURE], "vocab_size": vocab_size}
    if state_slots is not None:
        config["state_slots"] = state_slots
    (dest / "config.json").write_text(json.dumps(config))
    return dest
