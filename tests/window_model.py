"""A test-only model line whose KV has a window group: each token's id is kept per position,
and the next token depends on every earlier token (read through the full group's table) and,
weighted by distance, on the last `horizon + 1` (read through the window group's table). So a
wrong or stale window block changes the output, which `expected_tokens` predicts exactly.

`HistoryLine` (config `"kv_window": h`) keeps both reads in one full group, through
`block_tables` alone, as every single-group line does; `WindowedHistoryLine` (the same config
with `"kv_groups": true`) keeps the window's copy in a window group of horizon h
(`capabilities.SupportsKVGroups`). Both give the same tokens."""

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
from openinfer_kvcache import GroupedKVManager, PagedKVManager, group_pool_blocks

ARCHITECTURE = "WindowHistoryForCausalLM"
TOKEN_BYTES = 8  # one int64 per position and group


def next_token(tokens: Sequence[int], horizon: int, vocab_size: int) -> int:
    """What the model predicts after `tokens`: the sum of them all, plus the last
    `horizon + 1` (the reader's window) weighted 1, 2, ... towards the reader."""
    p = len(tokens) - 1
    window = sum((q - (p - horizon) + 1) * tokens[q] for q in range(max(0, p - horizon), p + 1))
    return (sum(tokens) + window) % vocab_size


def expected_tokens(prompt: Sequence[int], n: int, horizon: int, vocab_size: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(next_token(tokens, horizon, vocab_size))
    return tokens[len(prompt):]


class HistoryModel:
    """One full group: `history[block, offset]` is the token id at that position."""

    def __init__(self, vocab_size: int, horizon: int, max_model_len: int,
                 device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.horizon = horizon
        self.max_model_len = max_model_len
        self.device = device
        self.history = torch.zeros(0, 1, dtype=torch.int64)

    def kv_bytes_per_block(self, block_size: int) -> int:
        return TOKEN_BYTES * block_size

    def create_kv_cache(self, num_blocks: int, block_size: int) -> KVManager:
        self.history = torch.zeros(num_blocks, block_size, dtype=torch.int64)
        return PagedKVManager(num_blocks, block_size)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        self.history.view(-1)[batch.slot_mapping] = batch.input_ids
        self._write(batch)
        starts = batch.query_start_loc.tolist()
        logits = torch.zeros(len(batch.logits_indices), self.vocab_size)
        for i, token in enumerate(batch.logits_indices.tolist()):
            row = next(b for b in range(len(starts) - 1) if starts[b] <= token < starts[b + 1])
            p = int(batch.positions[token])
            lo = max(0, p - self.horizon)
            seen = _read(self.history, batch.block_tables[row], 0, p)
            window = self._read_window(batch, row, lo, p)
            weights = torch.arange(len(window)) + (lo - (p - self.horizon) + 1)
            logits[i, int(seen.sum() + (weights * window).sum()) % self.vocab_size] = 10.0
        return logits

    def _write(self, batch: ForwardBatch) -> None:
        """Writes a window group's entries (none here)."""

    def _read_window(self, batch: ForwardBatch, row: int, lo: int, hi: int) -> torch.Tensor:
        return _read(self.history, batch.block_tables[row], lo, hi)


def _read(data: torch.Tensor, table: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """The ids at positions lo..hi of the request with block table `table`."""
    size = data.shape[1]
    positions = torch.arange(lo, hi + 1)
    return data[table[positions // size].long(), positions % size]


class WindowedHistoryModel(HistoryModel):
    """The window's copy in a window group of horizon `horizon`, first in `kv_groups` (so the
    full group is not group 0). Strict, to fail loudly where the engine gets groups wrong:
    every batch must carry the groups' tables (its engine runs on CPU, where start-up runs no
    scratch batch), and no read may land in a block the window group gave back."""

    def __init__(self, vocab_size: int, horizon: int, max_model_len: int,
                 device: torch.device) -> None:
        super().__init__(vocab_size, horizon, max_model_len, device)
        self.kv_groups = (KVGroupSpec("window", horizon), KVGroupSpec("full"))
        self.window = torch.zeros(0, 1, dtype=torch.int64)
        self.pool_blocks: tuple[int, ...] = ()

    def kv_window_bytes(self, block_size: int, limits: KVStepLimits) -> int:
        return TOKEN_BYTES * block_size * group_pool_blocks(self.kv_groups, 0, block_size,
                                                            limits)[0]

    def create_kv_cache(self, num_blocks: int, block_size: int,
                        limits: KVStepLimits | None = None) -> KVManager:
        self.pool_blocks = group_pool_blocks(self.kv_groups, num_blocks, block_size, limits)
        self.window = torch.zeros(self.pool_blocks[0], block_size, dtype=torch.int64)
        self.history = torch.zeros(num_blocks, block_size, dtype=torch.int64)
        return GroupedKVManager(self.kv_groups, self.pool_blocks, block_size)

    def kv_group_block_tensors(self) -> tuple[list[torch.Tensor], ...]:
        return [self.window], [self.history]

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if len(batch.group_block_tables) != 2 or batch.group_table(1) is not batch.block_tables:
            raise AssertionError("a step without its KV groups' block tables")
        return super().forward(batch)

    def _write(self, batch: ForwardBatch) -> None:
        counts = batch.query_start_loc[1:] - batch.query_start_loc[:-1]
        rows = torch.repeat_interleave(torch.arange(len(counts)), counts)
        size = self.window.shape[1]
        blocks = batch.group_table(0)[rows, batch.positions // size].long()
        if (blocks == 0).any():
            raise AssertionError("a token's window entry goes to the padding block")
        self.window.view(-1)[blocks * size + batch.positions % size] = batch.input_ids

    def _read_window(self, batch: ForwardBatch, row: int, lo: int, hi: int) -> torch.Tensor:
        table = batch.group_table(0)[row]
        if (table[lo // self.window.shape[1]:hi // self.window.shape[1] + 1] == 0).any():
            raise AssertionError(f"the window of positions {lo}..{hi} reads a padding block")
        return _read(self.window, table, lo, hi)


class HistoryLine:
    name: ClassVar[str] = "window-history"
    supports_tensor_parallel: ClassVar[Literal[True]] = True

    @classmethod
    def load(cls, model_dir: Path, config: dict[str, Any],
             options: LoadOptions) -> HistoryModel:
        kind = WindowedHistoryModel if config.get("kv_groups") else HistoryModel
        return kind(int(config["vocab_size"]), int(config["kv_window"]),
                    options.max_model_len or 256, options.device)


class HistoryTP2:
    """The same line over 2 ranks (every rank runs the whole model: only rank 0's logits
    count, but a rank without the right tables fails its forward)."""

    name: ClassVar[str] = "window-history-tp2"

    @classmethod
    def load(cls, model_dir: Path, config: dict[str, Any],
             options: LoadOptions) -> TensorParallelModel:
        return TensorParallelModel.start(HistoryLine, model_dir, config, options, 2,
                                         timeout_s=30.0)


class WindowPlugin:
    def __init__(self, ranks: int = 1) -> None:
        self.target = "window_model:HistoryLine" if ranks == 1 else "window_model:HistoryTP2"

    @hookimpl
    def openinfer_register_models(self, register: RegisterModel) -> None:
        register("window-history", self.target, architectures=(ARCHITECTURE,))


def write_checkpoint(dest: Path, *, horizon: int, groups: bool, vocab_size: int = 997) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [ARCHITECTURE], "vocab_size": vocab_size, "kv_window": horizon,
              "kv_groups": groups}
    (dest / "config.json").write_text(json.dumps(config))
    return dest
