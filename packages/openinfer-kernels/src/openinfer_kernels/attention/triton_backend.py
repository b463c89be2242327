"""The `triton` attention backend: the default on CUDA."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from openinfer_kernels.attention.kv_scales import scale_tensors
from openinfer_kernels.attention.triton import SPLIT_MAX_TOKENS, paged_attention_triton
from openinfer_kernels.kv_store import kv_append

if TYPE_CHECKING:
    from openinfer_core.interfaces.attention import KVScales
    from openinfer_core.interfaces.model import ForwardBatch


class TritonAttentionBackend:
    """Appends K/V with `kv_append`, then runs the Triton paged attention kernels, sized by the
    batch's host-side `max_query_len` so that decode steps never sync (CUDA-graph safe)."""

    name = "triton"
    cuda_graph_safe = True  # decode launches depend on shapes only, never on lengths
    # Any step of at most this many tokens runs `paged_split`, whose launches depend on T and
    # B only: steps of any mix up to this many tokens can be captured too.
    cuda_graph_max_tokens = SPLIT_MAX_TOKENS

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
               scale: float, *, kv_scales: KVScales | None = None) -> torch.Tensor:
        k_scale, v_scale = scale_tensors(kv_scales)
        kv_append(k, v, k_cache, v_cache, batch.slot_mapping, k_scale=k_scale, v_scale=v_scale)
        return self.attend_appended(q, k_cache, v_cache, batch, scale, kv_scales=kv_scales)

    def attend_appended(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        batch: ForwardBatch, scale: float, *,
                        kv_scales: KVScales | None = None) -> torch.Tensor:
        k_scale, v_scale = scale_tensors(kv_scales)
        return paged_attention_triton(q, k_cache, v_cache, batch.block_tables, batch.seq_lens,
                                      batch.query_start_loc, scale,
                                      max_query_len=batch.max_query_len,
                                      max_seq_len=batch.max_seq_len, k_scale=k_scale,
                                      v_scale=v_scale)
