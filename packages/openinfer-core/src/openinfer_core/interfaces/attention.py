"""Attention backends: how a layer's queries meet the paged KV cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing.TypeIs from Python 3.13

    from openinfer_core.interfaces.model import ForwardBatch


@runtime_checkable
class AttentionBackend(Protocol):
    """Registered through `openinfer_register_attention_backends`. Stateless between steps.

    What a backend may offer beyond `attend` it declares by implementing a protocol: CUDA
    graphs (`capabilities.SupportsCudaGraphs`: model lines capture steps only where their
    backend can be) and `SupportsAttendAppended` below."""

    name: str

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
               scale: float, *, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
        """Write this step's `k`, `v` ([T, Hkv, D]) into the caches
        ([num_blocks, block_size, Hkv, D]) at `batch.slot_mapping` (mutates the caches), then
        return causal attention of `q` ([T, Hq, D]) over each request's context, [T, Hq, D].
        Caches in float8_e4m3fn (`--kv-cache-dtype fp8`) store k / k_scale and v / v_scale,
        saturated at +-448, and are read back times their scales (vLLM's per-tensor FP8 KV);
        model lines pass the scales only with such caches."""
        ...


@runtime_checkable
class SupportsAttendAppended(Protocol):
    """A backend that attends over K/V the model has already written into the caches (fused
    into its q/k norm and rotary kernel, `openinfer_kernels.qk_norm_rope_append`). Model lines
    call it when the backend has it and `attend` otherwise; the openinfer-kernels backends all
    do (their `attend` appends, then calls it: a subclass changes the attention here)."""

    def attend_appended(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        batch: ForwardBatch, scale: float, *, k_scale: float = 1.0,
                        v_scale: float = 1.0) -> torch.Tensor:
        """`attend` for a step whose K/V are already in the caches; mutates nothing."""
        ...


def supports_attend_appended(backend: object) -> TypeIs[SupportsAttendAppended]:
    return isinstance(backend, SupportsAttendAppended)
