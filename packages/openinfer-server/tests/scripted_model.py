"""A scripted model line for server tests: it writes fixed replies, token by token, through
the real engine, registered as a plugin through the model hook.

The checkpoint's config.json holds `scripts`, pairs of a trigger text and a reply text,
tokenized at load with the checkpoint's tokenizer (the real Qwen3 one, so `<tool_call>` and
`<think>` are single tokens as in a real model). Its "KV cache" keeps each position's token id,
so it reads a sequence's whole history: it takes the script whose trigger occurs last, finds
how much of the reply the sequence already ends with, and writes the next token of the reply,
then `<|im_end|>`. Without a trigger it ends at once."""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Any, ClassVar

import torch

from openinfer_core.hookspecs import hookimpl
from openinfer_core.interfaces.kv import KVManager
from openinfer_core.interfaces.model import ForwardBatch, LoadOptions
from openinfer_core.registry import RegisterModel
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_kvcache import PagedKVManager

IM_END = 151645
ENDOFTEXT = 151643

Script = tuple[list[int], list[int]]  # trigger ids, reply ids


class ScriptedModel:
    def __init__(self, scripts: list[Script], vocab_size: int, max_model_len: int,
                 device: torch.device) -> None:
        self.scripts = scripts
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.device = device
        self._ids = torch.zeros(0, dtype=torch.long)
        self._block_size = 1

    def kv_bytes_per_block(self, block_size: int) -> int:
        return 8 * block_size  # one int64 token id per position

    def create_kv_cache(self, num_blocks: int, block_size: int) -> KVManager:
        self._ids = torch.zeros(num_blocks * block_size, dtype=torch.long)
        self._block_size = block_size
        return PagedKVManager(num_blocks, block_size)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        self._ids[batch.slot_mapping] = batch.input_ids
        # Every other token far below the scripted one: sampling at any temperature picks it.
        logits = torch.full((len(batch.logits_indices), self.vocab_size), -100.0)
        starts = batch.query_start_loc.tolist()
        for row, index in enumerate(batch.logits_indices.tolist()):
            seq = bisect.bisect_right(starts, index) - 1
            length = int(batch.positions[index]) + 1
            logits[row, self._next(self._history(batch.block_tables[seq], length))] = 0.0
        return logits

    def _history(self, block_table: torch.Tensor, length: int) -> list[int]:
        positions = torch.arange(length)
        blocks = block_table[positions // self._block_size].long()
        ids: list[int] = self._ids[blocks * self._block_size + positions % self._block_size
                                   ].tolist()
        return ids

    def _next(self, history: list[int]) -> int:
        found: tuple[int, list[int]] | None = None  # where the reply may begin, the reply
        for trigger, reply in self.scripts:
            at = _last_end(history, trigger)
            if at is not None and (found is None or at > found[0]):
                found = (at, reply)
        if found is None:
            return IM_END
        begin, reply = found
        for done in range(min(len(reply), len(history) - begin), 0, -1):
            if history[-done:] == reply[:done]:
                return reply[done] if done < len(reply) else IM_END
        return reply[0] if reply else IM_END


def _last_end(history: list[int], needle: list[int]) -> int | None:
    """Where the last occurrence of `needle` in `history` ends, or None."""
    n = len(needle)
    for start in range(len(history) - n, -1, -1):
        if history[start:start + n] == needle:
            return start + n
    return None


class ScriptedLine:
    name: ClassVar[str] = "scripted"

    @classmethod
    def load(cls, model_dir: Path, config: dict[str, Any],
             options: LoadOptions) -> ScriptedModel:
        tokenizer = Tokenizer.from_dir(model_dir)

        def ids(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False)

        scripts = [(ids(trigger), ids(reply)) for trigger, reply in config["scripts"]]
        max_len = options.max_model_len or int(config["max_position_embeddings"])
        return ScriptedModel(scripts, int(config["vocab_size"]), max_len, options.device)


def write_scripted_checkpoint(dest: Path, scripts: dict[str, str]) -> Path:
    """A checkpoint of the scripted line (trigger text -> reply text) with the Qwen3
    tokenizer and chat template."""
    from openinfer_qwen3.tokenizer_files import write_qwen3_tokenizer

    dest.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["ScriptedForCausalLM"], "model_type": "scripted",
              "vocab_size": 151936, "max_position_embeddings": 1024,
              "scripts": list(scripts.items())}
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    (dest / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [IM_END, ENDOFTEXT]}))
    write_qwen3_tokenizer(dest)
    return dest


@hookimpl
def openinfer_register_models(register: RegisterModel) -> None:
    register("scripted", "scripted_model:ScriptedLine", architectures=("ScriptedForCausalLM",),
             tool_parser="hermes", reasoning_parser="qwen3")
