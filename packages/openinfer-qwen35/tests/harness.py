"""Drives a Qwen3.5 model's forward without the engine: each request gets K/V blocks and a
state slot, and `step` builds the `ForwardBatch` of one step (its rows' new tokens), with the
full group's and the state group's tables as the engine will pass them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from openinfer_core.interfaces.model import ForwardBatch, LoadOptions
from openinfer_core.model_config import read_model_config
from openinfer_kernels.attention.backend import TorchAttentionBackend
from openinfer_qwen35.model import Qwen35Model
from openinfer_qwen35.model_line import Qwen35ModelLine

BLOCK = 4


def load(folder: Path, load_format: str = "safetensors") -> Qwen35Model:
    options = LoadOptions(device=torch.device("cpu"), dtype=torch.float32,
                          attention=TorchAttentionBackend(), load_format=load_format)
    return Qwen35ModelLine.load(folder, read_model_config(folder), options)


@dataclass
class Request:
    slot: int
    blocks: list[int] = field(default_factory=list)
    computed: int = 0  # tokens with K/V and state


class Harness:
    def __init__(self, model: Qwen35Model, *, num_blocks: int = 256, num_slots: int = 12):
        self.model = model
        model.allocate_caches(num_blocks, BLOCK, num_slots)
        self.free_blocks = list(range(num_blocks - 1, 0, -1))
        self.free_slots = list(range(num_slots - 1, 0, -1))
        self.requests: dict[str, Request] = {}

    def add(self, rid: str, slot: int | None = None) -> None:
        if slot is not None:
            self.free_slots.remove(slot)
        self.requests[rid] = Request(self.free_slots.pop() if slot is None else slot)

    def finish(self, rid: str) -> None:
        req = self.requests.pop(rid)
        self.free_slots.append(req.slot)
        self.free_blocks += req.blocks

    def step(self, rows: list[tuple[str, list[int]]], *, all_logits: bool = False
             ) -> torch.Tensor:
        """Run each row's new tokens; the logits of every row's last token ([B, V]), or of
        every token with `all_logits`. A request id seen for the first time is added."""
        ids, positions, slots, lens, tables = [], [], [], [], []
        for rid, tokens in rows:
            if rid not in self.requests:
                self.add(rid)
            req = self.requests[rid]
            start, end = req.computed, req.computed + len(tokens)
            while len(req.blocks) * BLOCK < end:
                req.blocks.append(self.free_blocks.pop())
            ids += tokens
            for pos in range(start, end):
                positions.append(pos)
                slots.append(req.blocks[pos // BLOCK] * BLOCK + pos % BLOCK)
            lens.append(end)
            tables.append(req.blocks)
            req.computed = end
        width = max(len(t) for t in tables)
        block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables],
                                    dtype=torch.int32)
        qsl = torch.tensor([0] + [len(t) for _, t in rows], dtype=torch.int32).cumsum(0)
        state_table = torch.tensor([[self.requests[rid].slot] for rid, _ in rows],
                                   dtype=torch.int32)
        picked = torch.arange(len(ids)) if all_logits else qsl[1:].long() - 1
        batch = ForwardBatch(
            input_ids=torch.tensor(ids), positions=torch.tensor(positions),
            slot_mapping=torch.tensor(slots), query_start_loc=qsl.to(torch.int32),
            seq_lens=torch.tensor(lens, dtype=torch.int32), block_tables=block_tables,
            logits_indices=picked, max_query_len=max(len(t) for _, t in rows),
            max_seq_len=max(lens), query_start_loc_cpu=qsl.to(torch.int32),
            seq_lens_cpu=torch.tensor(lens, dtype=torch.int32), block_tables_cpu=block_tables,
            group_block_tables=(block_tables, state_table))
        with torch.no_grad():
            return self.model.forward(batch)

    def greedy(self, rid: str, prompt: list[int], steps: int,
               chunk: int | None = None) -> list[int]:
        """Prefill `prompt` (in chunks of `chunk` tokens), then decode `steps` greedy tokens
        one step at a time."""
        chunk = chunk or len(prompt)
        for start in range(0, len(prompt), chunk):
            logits = self.step([(rid, prompt[start:start + chunk])])
        out = [int(logits[0].argmax())]
        while len(out) < steps:
            out.append(int(self.step([(rid, [out[-1]])])[0].argmax()))
        return out
