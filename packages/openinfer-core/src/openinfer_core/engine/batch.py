"""One step's rows laid out flat on the host (numpy), then moved to the device in one go."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from openinfer_core.interfaces.kv import KVManager
from openinfer_core.interfaces.model import ForwardBatch
from openinfer_core.interfaces.scheduler import ScheduledRow


@dataclass(slots=True)
class HostBatch:
    """The host image of a `ForwardBatch` (same fields, numpy arrays)."""

    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64
    query_start_loc: np.ndarray  # [B + 1] int32
    seq_lens: np.ndarray  # [B] int32
    block_tables: np.ndarray  # [B, width] int32
    logits_indices: np.ndarray  # [S] int64
    max_query_len: int
    max_seq_len: int

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    def pending_tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """PENDING token slots (negative ids): their positions in the step, and the row each
        ends (a pending token is always the last token of its row). The slots are set to 0."""
        where = np.flatnonzero(self.input_ids < 0)
        if len(where):
            self.input_ids[where] = 0
        rows = np.searchsorted(self.query_start_loc, where, side="right") - 1
        return where, rows

    @property
    def is_decode(self) -> bool:
        """Every row runs exactly one token and samples: the shape CUDA graphs replay."""
        return self.max_query_len == 1 and len(self.logits_indices) == self.num_seqs

    def to_device(self, device: torch.device) -> ForwardBatch:
        def dev(a: np.ndarray) -> torch.Tensor:
            host = torch.from_numpy(a)
            if device.type == "cuda":
                # From pageable memory the copy would wait for the work already queued (the
                # step in flight, with overlapped steps); from pinned memory it does not.
                host = host.pin_memory()
            return host.to(device, non_blocking=True)

        return ForwardBatch(
            input_ids=dev(self.input_ids), positions=dev(self.positions),
            slot_mapping=dev(self.slot_mapping), query_start_loc=dev(self.query_start_loc),
            seq_lens=dev(self.seq_lens), block_tables=dev(self.block_tables),
            logits_indices=dev(self.logits_indices), max_query_len=self.max_query_len,
            max_seq_len=self.max_seq_len,
            query_start_loc_cpu=torch.from_numpy(self.query_start_loc),
            seq_lens_cpu=torch.from_numpy(self.seq_lens),
            block_tables_cpu=torch.from_numpy(self.block_tables), host=self)

    @classmethod
    def of(cls, batch: ForwardBatch) -> HostBatch:
        """The host image of a device batch: `batch.host` where it has one, else its fields
        read back from the device (a synchronisation; start-up and tests only)."""
        known = batch.host
        if known is not None:
            if (len(known.input_ids), known.num_seqs, len(known.logits_indices),
                    known.block_tables.shape) != (batch.num_tokens, batch.num_seqs,
                                                  len(batch.logits_indices),
                                                  tuple(batch.block_tables.shape)):
                raise ValueError("ForwardBatch.host does not describe its batch: change the "
                                 "HostBatch before to_device(), or set host=None")
            return known

        def host(t: torch.Tensor) -> np.ndarray:
            return t.cpu().numpy()

        return cls(
            input_ids=host(batch.input_ids), positions=host(batch.positions),
            slot_mapping=host(batch.slot_mapping), query_start_loc=host(batch.query_start_loc),
            seq_lens=host(batch.seq_lens), block_tables=host(batch.block_tables),
            logits_indices=host(batch.logits_indices), max_query_len=batch.max_query_len,
            max_seq_len=batch.max_seq_len)


def plan_batch(rows: Sequence[ScheduledRow], kv: KVManager) -> HostBatch:
    """Flatten the scheduled rows: token ids, positions, KV slots, block tables."""
    bs = kv.block_size
    n = len(rows)
    counts = np.fromiter((r.num_new_tokens for r in rows), dtype=np.int64, count=n)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    total = int(starts[-1])
    input_ids = np.empty(total, dtype=np.int64)
    positions = np.empty(total, dtype=np.int64)
    seq_lens = np.empty(n, dtype=np.int32)
    tables = [kv.block_ids(r.seq.request_id) for r in rows]
    block_tables = np.zeros((n, max((len(t) for t in tables), default=1) or 1), dtype=np.int32)
    samples = np.fromiter((r.samples for r in rows), dtype=bool, count=n)
    for b, row in enumerate(rows):
        seq, k, s = row.seq, row.num_new_tokens, int(starts[b])
        lo = seq.num_computed_tokens
        if k == 1:
            input_ids[s] = seq.token_ids[lo]
            positions[s] = lo
        else:
            input_ids[s:s + k] = seq.token_ids[lo:lo + k]
            positions[s:s + k] = np.arange(lo, lo + k)
        seq_lens[b] = lo + k
        table = tables[b]
        block_tables[b, :len(table)] = table
    row_of_token = np.repeat(np.arange(n), counts)
    slot_mapping = (block_tables[row_of_token, positions // bs].astype(np.int64) * bs
                    + positions % bs)
    return HostBatch(
        input_ids=input_ids, positions=positions, slot_mapping=slot_mapping,
        query_start_loc=starts.astype(np.int32), seq_lens=seq_lens, block_tables=block_tables,
        logits_indices=starts[1:][samples] - 1,
        max_query_len=int(counts.max(initial=0)), max_seq_len=int(seq_lens.max(initial=0)))
