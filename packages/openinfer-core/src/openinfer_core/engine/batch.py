"""One step's rows laid out flat on the host (`interfaces.model.HostBatch`, numpy arrays), then
moved to the device in one go."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from openinfer_core.interfaces.kv import SCRATCH_STATE_SLOTS, GroupedKV, KVGroupSpec, KVManager
from openinfer_core.interfaces.model import HostBatch
from openinfer_core.interfaces.scheduler import ScheduledRow

# Per manager class, whether it is a `GroupedKV`: a protocol check costs tens of microseconds,
# too much for every step.
_GROUPED_CLASSES: dict[type, bool] = {}


def several_groups(kv: KVManager) -> GroupedKV | None:
    """`kv` where it keeps several KV groups, else None."""
    grouped = _GROUPED_CLASSES.get(type(kv))
    if grouped is None:
        grouped = _GROUPED_CLASSES[type(kv)] = isinstance(kv, GroupedKV)
    if not grouped:
        return None
    groups = cast("GroupedKV", kv)
    return groups if len(groups.groups) > 1 else None


def plan_batch(rows: Sequence[ScheduledRow], kv: KVManager) -> HostBatch:
    """Flatten the scheduled rows: token ids, positions, KV slots, block tables (every KV
    group's, where `kv` has several)."""
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
        max_query_len=int(counts.max(initial=0)), max_seq_len=int(seq_lens.max(initial=0)),
        group_block_tables=() if (groups := several_groups(kv)) is None
        else _group_tables(rows, groups, block_tables))


def _group_tables(rows: Sequence[ScheduledRow], kv: GroupedKV,
                  block_tables: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every KV group's tables, `block_tables` standing for the first full group's (every
    token group's table of a request has its full group's length; a state group's is
    `[rows, 1]`, each row's slot)."""
    full = next(g for g, spec in enumerate(kv.groups) if spec.is_full)
    n = len(rows)
    out = [np.zeros((n, 1), dtype=np.int32) if spec.state else np.zeros_like(block_tables)
           for spec in kv.groups]
    out[full] = block_tables
    for b, row in enumerate(rows):
        for g, table in enumerate(kv.group_block_ids(row.seq.request_id)):
            if g != full:
                out[g][b, :len(table)] = table
    return tuple(out)


def scratch_group_tables(groups: Sequence[KVGroupSpec],
                         block_tables: np.ndarray) -> tuple[np.ndarray, ...]:
    """`group_block_tables` for a start-up scratch batch of a model with these KV groups:
    none without a state group (every group reads `block_tables`). With one, every token
    group's is `block_tables` and a state group's gives row b the slot min(its first block,
    SCRATCH_STATE_SLOTS - 1), inside the scratch cache's state pool
    (`openinfer_kvcache.group_pool_blocks`); rows may share a slot, whose contents nobody
    reads back."""
    if not any(g.state for g in groups):
        return ()
    slots = np.minimum(block_tables[:, :1], SCRATCH_STATE_SLOTS - 1).astype(np.int32)
    return tuple(slots if g.state else block_tables for g in groups)
