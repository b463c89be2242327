"""Executing a scheduled step: flatten the rows into a `ForwardBatch`, run the model, sample."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from openinfer_core.interfaces.kv import KVManager
from openinfer_core.interfaces.model import ForwardBatch, Model
from openinfer_core.interfaces.scheduler import ScheduledRow, SchedulerOutput
from openinfer_core.sampling.sampler import SampledToken, Sampler, SamplingRow


def build_batch(rows: Seq[ScheduledRow], kv: KVManager, device: torch.device) -> ForwardBatch:
    """Host-side layout of one step; tensors are built on the host and moved once."""
    bs = kv.block_size
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts = [0]
    seq_lens: list[int] = []
    tables: list[Seq[int]] = []
    logits_indices: list[int] = []
    for row in rows:
        seq = row.seq
        lo = seq.num_computed_tokens
        hi = lo + row.num_new_tokens
        table = kv.block_ids(seq.request_id)
        input_ids.extend(seq.token_ids[lo:hi])
        positions.extend(range(lo, hi))
        slots.extend(table[p // bs] * bs + p % bs for p in range(lo, hi))
        starts.append(starts[-1] + row.num_new_tokens)
        seq_lens.append(hi)
        tables.append(table)
        if row.samples:
            logits_indices.append(starts[-1] - 1)
    width = max((len(t) for t in tables), default=0)
    block_tables = torch.zeros((len(tables), max(width, 1)), dtype=torch.int32)
    for b, table in enumerate(tables):
        if table:
            block_tables[b, : len(table)] = torch.tensor(table, dtype=torch.int32)

    def dev(values: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

    return ForwardBatch(
        input_ids=dev(input_ids, torch.int64),
        positions=dev(positions, torch.int64),
        slot_mapping=dev(slots, torch.int64),
        query_start_loc=dev(starts, torch.int32),
        seq_lens=dev(seq_lens, torch.int32),
        block_tables=block_tables.to(device, non_blocking=True),
        logits_indices=dev(logits_indices, torch.int64),
        max_query_len=max((r.num_new_tokens for r in rows), default=0),
        max_seq_len=max(seq_lens, default=0),
    )


class ModelRunner:
    """Owns nothing but references: the model (with its KV buffer), the KV manager's block
    tables, and the sampler."""

    def __init__(self, model: Model, kv: KVManager, sampler: Sampler,
                 eos_token_ids: tuple[int, ...]) -> None:
        self.model = model
        self.kv = kv
        self.sampler = sampler
        self.eos_token_ids = eos_token_ids

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> list[SampledToken]:
        batch = build_batch(output.rows, self.kv, self.model.device)
        logits = self.model.forward(batch)
        rows = [self._sampling_row(r) for r in output.rows if r.samples]
        if not rows:
            return []
        return self.sampler.sample(logits, rows)

    def _sampling_row(self, row: ScheduledRow) -> SamplingRow:
        seq = row.seq
        params = seq.request.params
        banned: tuple[int, ...] = ()
        if seq.num_output_tokens < params.min_tokens:
            # Stop ids may not end the request before min_tokens; forbid them until then.
            banned = params.stop_token_ids + (() if params.ignore_eos else self.eos_token_ids)
        return SamplingRow(params, seq.prompt_token_ids, seq.output_token_ids, banned)
