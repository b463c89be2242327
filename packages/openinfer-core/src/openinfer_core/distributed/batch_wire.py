"""A `ForwardBatch` sent from rank 0 to the other ranks, in two parts.

- `BatchHeader`: the sizes and the host-side fields (`max_query_len`, the `*_cpu` mirrors),
  pickled and published once over ZeroMQ: it wakes the idle workers.
- The device tensors, packed into one flat int64 tensor that rank 0 broadcasts over the
  tensor-parallel group: on CUDA the ids sampled by the step before stay on the device (no host
  sync, so overlapped steps keep overlapping) and one broadcast carries the whole batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from openinfer_core.interfaces.model import ForwardBatch

# The device fields, in packing order, with their dtypes on arrival.
_FIELDS = (("input_ids", torch.int64), ("positions", torch.int64),
           ("slot_mapping", torch.int64), ("query_start_loc", torch.int32),
           ("seq_lens", torch.int32), ("block_tables", torch.int32),
           ("logits_indices", torch.int64))


@dataclass(frozen=True, slots=True)
class BatchHeader:
    num_tokens: int
    num_seqs: int
    max_blocks: int  # block_tables' width
    num_logits: int
    max_query_len: int
    max_seq_len: int
    # The host mirrors (query_start_loc, seq_lens, block_tables), when rank 0's batch had them.
    host: tuple[np.ndarray, np.ndarray, np.ndarray] | None

    def sizes(self) -> list[int]:
        t, b = self.num_tokens, self.num_seqs
        return [t, t, t, b + 1, b, b * self.max_blocks, self.num_logits]


def header_of(batch: ForwardBatch) -> BatchHeader:
    host = None
    if (batch.query_start_loc_cpu is not None and batch.seq_lens_cpu is not None
            and batch.block_tables_cpu is not None):
        host = (batch.query_start_loc_cpu.numpy(), batch.seq_lens_cpu.numpy(),
                batch.block_tables_cpu.numpy())
    return BatchHeader(batch.num_tokens, batch.num_seqs, int(batch.block_tables.shape[1]),
                       int(batch.logits_indices.shape[0]), batch.max_query_len,
                       batch.max_seq_len, host)


def pack(batch: ForwardBatch) -> torch.Tensor:
    """The device fields of `batch`, flat, int64, on its device: [sum(header.sizes())]."""
    return torch.cat([getattr(batch, name).reshape(-1).to(torch.int64) for name, _ in _FIELDS])


def empty_flat(header: BatchHeader, device: torch.device) -> torch.Tensor:
    """Where a worker receives the broadcast of `pack(batch)`."""
    return torch.empty(sum(header.sizes()), dtype=torch.int64, device=device)


def unpack(header: BatchHeader, flat: torch.Tensor) -> ForwardBatch:
    """The `ForwardBatch` that `pack` flattened, on `flat`'s device."""
    parts = flat.split(header.sizes())
    fields = {name: part.to(dtype) for (name, dtype), part in zip(_FIELDS, parts, strict=True)}
    fields["block_tables"] = fields["block_tables"].view(header.num_seqs, header.max_blocks)
    host = None if header.host is None else [torch.from_numpy(a) for a in header.host]
    return ForwardBatch(
        **fields, max_query_len=header.max_query_len, max_seq_len=header.max_seq_len,
        query_start_loc_cpu=None if host is None else host[0],
        seq_lens_cpu=None if host is None else host[1],
        block_tables_cpu=None if host is None else host[2])
