"""A captured graph's step inputs, packed into one buffer so that they land in one copy.

A replay's token ids, positions, slots and sequence lengths (and for a mixed step its query
starts and sampled rows) would otherwise take as many host-to-device copies, ~6 us of GPU time
each at batch 1 on the H100. Every graph owns one int64 buffer holding all of them, each field
starting on 16 bytes (the alignment Triton specializes pointers on), and the host lays a step
out in a pinned buffer of the same layout: one copy of the buffer's prefix moves the whole step.

Layout, in int64 words: ids, positions, slots [T]; seq_lens [S] int32; query_start_loc [S + 1]
int32; logits_indices [S]. A decode graph's last two are constant (request b owns token b and
samples it), so its copy stops after seq_lens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from openinfer_core.interfaces.model import HostBatch

FIELDS = ("input_ids", "positions", "slot_mapping", "seq_lens", "query_start_loc",
          "logits_indices")
INT32 = frozenset({"seq_lens", "query_start_loc"})


def _length(field: str, tokens: int, slots: int) -> int:
    """Entries of `field` in a T-token, S-slot graph."""
    if field in ("input_ids", "positions", "slot_mapping"):
        return tokens
    return slots + (field == "query_start_loc")


def _words(field: str, tokens: int, slots: int) -> int:
    """int64 words `field` takes, rounded up to whole 16-byte units."""
    n = _length(field, tokens, slots)
    words = (n + 1) // 2 if field in INT32 else n
    return words + (words & 1)


@dataclass(frozen=True)
class InputLayout:
    """Where each field of a T-token, S-slot graph lies in its buffer."""

    tokens: int
    slots: int
    decode: bool

    @property
    def offsets(self) -> dict[str, int]:
        out, at = {}, 0
        for field in FIELDS:
            out[field] = at
            at += _words(field, self.tokens, self.slots)
        return out

    @property
    def words(self) -> int:
        """The whole buffer, in int64 words."""
        return sum(_words(f, self.tokens, self.slots) for f in FIELDS)

    @property
    def copied(self) -> int:
        """Words a step copies in: up to seq_lens for a decode graph, everything else."""
        return self.offsets["query_start_loc"] if self.decode else self.words

    def views(self, buffer: Any) -> dict[str, Any]:
        """Each field as a view of `buffer` (a torch tensor or numpy array, int64)."""
        out = {}
        for field, at in self.offsets.items():
            words = buffer[at:at + _words(field, self.tokens, self.slots)]
            if field in INT32:
                words = (words.view(torch.int32) if isinstance(words, torch.Tensor)
                         else words.view(np.int32))
            out[field] = words[:_length(field, self.tokens, self.slots)]
        return out

    def reset(self, views: dict[str, Any]) -> None:
        """The inputs as at capture: every token padding (token 0 at position 0, into block 0),
        every request one token long; a decode graph's constant query starts and rows."""
        for field in ("input_ids", "positions", "slot_mapping"):
            views[field][:] = 0
        views["seq_lens"][:] = 1
        if self.decode:
            views["query_start_loc"][:] = _arange(views["query_start_loc"])
            views["logits_indices"][:] = _arange(views["logits_indices"])
        else:
            views["query_start_loc"][:] = 0
            views["logits_indices"][:] = 0


def _arange(like: Any) -> Any:
    n = len(like)
    if isinstance(like, torch.Tensor):
        return torch.arange(n, dtype=like.dtype, device=like.device)
    return np.arange(n, dtype=like.dtype)


def stage_decode(host: dict[str, np.ndarray], batch: HostBatch) -> None:
    """Lay a decode step of B <= bucket rows out in a decode graph's host views; the rows past
    B are padding."""
    b = batch.num_seqs
    for field in ("input_ids", "positions", "slot_mapping"):
        host[field][:b] = getattr(batch, field)
        host[field][b:] = 0
    host["seq_lens"][:b] = batch.seq_lens
    host["seq_lens"][b:] = 1  # padding rows see one token, in block 0


def stage_mixed(host: dict[str, np.ndarray], batch: HostBatch) -> None:
    """Lay a mixed step out in a mixed graph's host views, as its T-token graph over S
    request slots reads it: padding tokens are token 0 at position 0 writing into block 0;
    padding requests see one token and own none; padding sampled rows read row 0."""
    t, b, k = len(batch.input_ids), batch.num_seqs, len(batch.logits_indices)
    for field in ("input_ids", "positions", "slot_mapping"):
        host[field][:t] = getattr(batch, field)
        host[field][t:] = 0
    host["seq_lens"][:b] = batch.seq_lens
    host["seq_lens"][b:] = 1
    host["query_start_loc"][:b + 1] = batch.query_start_loc
    host["query_start_loc"][b + 1:] = t
    host["logits_indices"][:k] = batch.logits_indices
    host["logits_indices"][k:] = 0


class GraphInputs:
    """One graph's input buffer on the device and its field views."""

    def __init__(self, layout: InputLayout, device: torch.device) -> None:
        self.layout = layout
        self.buffer = torch.zeros(layout.words, dtype=torch.int64, device=device)
        self.views = layout.views(self.buffer)
        self._copied = layout.copied
        self.reset()

    def reset(self) -> None:
        self.layout.reset(self.views)

    def copy_from(self, staging: torch.Tensor) -> None:
        """Queue the copy of a step laid out in `staging` (pinned, same layout) into the
        buffer: one host-to-device copy."""
        n = self._copied
        self.buffer[:n].copy_(staging[:n], non_blocking=True)
