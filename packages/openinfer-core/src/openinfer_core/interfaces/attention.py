"""Attention backends: how a layer's queries meet the paged KV cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from openinfer_core.interfaces.model import ForwardBatch


@runtime_checkable
class AttentionBackend(Protocol):
    """Registered through `openinfer_register_attention_backends`. Stateless between steps.

    A backend may set `cuda_graph_safe = True` when `attend` on a decode batch (one query per
    request) makes no host synchronisation and launches the same kernels whatever the context
    lengths; model lines then let the engine capture decode in CUDA graphs. It may also set
    `cuda_graph_max_tokens = N` when, for any batch of at most N tokens given a `max_query_len`
    of at least its real one, `attend` makes no host synchronisation and launches kernels that
    depend only on T, B and `max_query_len`: the engine then captures mixed steps (prefill
    chunks, prefix-cache hits, decodes) of up to N tokens too, passing `max_query_len` = T.

    A backend may also have `attend_appended(q, k_cache, v_cache, batch, scale)`: `attend` for
    a step whose K/V the model has already written into the caches (fused into its q/k norm and
    rotary kernel, `openinfer_kernels.qk_norm_rope_append`). Model lines use it when present and
    `attend` otherwise; the openinfer-kernels backends all have it (their `attend` appends,
    then calls it: a subclass changes the attention in `attend_appended`)."""

    name: str

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
               scale: float) -> torch.Tensor:
        """Write this step's `k`, `v` ([T, Hkv, D]) into the caches
        ([num_blocks, block_size, Hkv, D]) at `batch.slot_mapping` (mutates the caches), then
        return causal attention of `q` ([T, Hq, D]) over each request's context, [T, Hq, D]."""
        ...
