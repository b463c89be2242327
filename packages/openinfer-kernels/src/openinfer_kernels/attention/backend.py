"""The `torch` attention backend: the reference ops, on any device (on CUDA too, where the
public ops would run Triton kernels: the baseline to compare the `triton` backend with)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from openinfer_kernels.attention.kv_scales import scale_tensors
from openinfer_kernels.attention.reference import paged_attention_ref
from openinfer_kernels.kv_store.reference import kv_append_ref

if TYPE_CHECKING:
    from openinfer_core.interfaces.attention import KVScales
    from openinfer_core.interfaces.model import ForwardBatch


class TorchAttentionBackend:
    """Appends K/V with `kv_append_ref`, then runs `paged_attention_ref` over the whole batch."""

    name = "torch"

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
               scale: float, *, kv_scales: KVScales | None = None) -> torch.Tensor:
        k_scale, v_scale = scale_tensors(kv_scales)
        kv_append_ref(k, v, k_cache, v_cache, batch.slot_mapping, k_scale=k_scale,
                      v_scale=v_scale)
        return self.attend_appended(q, k_cache, v_cache, batch, scale, kv_scales=kv_scales)

    def attend_appended(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        batch: ForwardBatch, scale: float, *,
                        kv_scales: KVScales | None = None) -> torch.Tensor:
        k_scale, v_scale = scale_tensors(kv_scales)
        return paged_attention_ref(q, k_cache, v_cache, batch.block_tables, batch.seq_lens,
                                   batch.query_start_loc, scale, k_scale=k_scale,
                                   v_scale=v_scale)
