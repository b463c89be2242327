"""The `torch` attention backend: the reference ops, on any device."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from openinfer_kernels.attention import paged_attention
from openinfer_kernels.kv_store import kv_append

if TYPE_CHECKING:
    from openinfer_core.interfaces.model import ForwardBatch


class TorchAttentionBackend:
    """Appends K/V with `kv_append`, then runs `paged_attention` over the whole batch."""

    name = "torch"

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
               scale: float) -> torch.Tensor:
        kv_append(k, v, k_cache, v_cache, batch.slot_mapping)
        return paged_attention(q, k_cache, v_cache, batch.block_tables, batch.seq_lens,
                               batch.query_start_loc, scale)
