"""A counting "language model": after token t it predicts (t + step) mod vocab_size.

It is deliberately trivial so tests can predict every output, yet it goes through the same
contract as a real model line: config.json, the KV manager, `ForwardBatch`, logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import torch

from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.kv import KVManager
from openinfer_core.interfaces.model import ForwardBatch, LoadOptions
from openinfer_kvcache import PagedKVManager


class ToyCounterModel:
    def __init__(self, vocab_size: int, step: int, max_model_len: int,
                 device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.step = step
        self.max_model_len = max_model_len
        self.device = device

    def kv_bytes_per_block(self, block_size: int) -> int:
        return block_size  # it keeps no KV; a nominal byte per token sizes the pool

    def create_kv_cache(self, num_blocks: int, block_size: int) -> KVManager:
        return PagedKVManager(num_blocks, block_size)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        last = batch.input_ids[batch.logits_indices]
        target = (last + self.step) % self.vocab_size
        logits = torch.zeros(len(last), self.vocab_size, device=self.device)
        logits[torch.arange(len(last), device=self.device), target] = 10.0
        return logits


class ToyCounterLine:
    name: ClassVar[str] = "toy-counter"

    @classmethod
    def load(cls, model_dir: Path, config: dict[str, Any],
             options: LoadOptions) -> ToyCounterModel:
        vocab = config.get("vocab_size")
        if not isinstance(vocab, int) or vocab < 2:
            raise ModelConfigError(f"config.json: vocab_size must be an int >= 2, got {vocab!r}")
        max_len = options.max_model_len or int(config.get("max_position_embeddings", 1024))
        return ToyCounterModel(vocab, int(config.get("step", 1)), max_len, options.device)


def write_toy_checkpoint(dest: Path, *, vocab_size: int = 64, step: int = 1,
                         eos_token_id: int | None = None) -> Path:
    """A checkpoint folder the toy line loads: just config.json (and generation_config)."""
    dest.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["ToyCounterForCausalLM"], "model_type": "toy-counter",
              "vocab_size": vocab_size, "step": step, "max_position_embeddings": 256}
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    if eos_token_id is not None:
        (dest / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_token_id}))
    return dest
