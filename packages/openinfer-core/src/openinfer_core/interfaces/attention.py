"""Attention backends: how a layer's queries meet the paged KV cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing.TypeIs from Python 3.13

    from openinfer_core.interfaces.model import ForwardBatch


@dataclass(frozen=True, slots=True, eq=False)
class KVScales:
    """One layer's FP8 KV-cache scales, fp32 [Hkv] each: head h of an e4m3 page holds
    k / k[h] (v / v[h]) and is read back times that scale. A checkpoint's per-tensor scale is
    its value repeated, so that kernels read a head's scale one way (`scale_ptr + kv_head`)
    whatever the checkpoint held; tensors rather than numbers, so CUDA graphs replay them.
    `per_tensor`: (k, v) as host floats when every head has the same two scales (FlashInfer's
    paged kernels take only such numbers), else None."""

    k: torch.Tensor
    v: torch.Tensor
    per_tensor: tuple[float, float] | None

    @classmethod
    def of(cls, k: torch.Tensor, v: torch.Tensor) -> KVScales:
        """From host tensors of Hkv scales each (reads them: keep them off the GPU here)."""
        k, v = k.detach().float().flatten(), v.detach().float().flatten()
        if k.shape != v.shape or k.numel() == 0:
            raise ValueError(f"KV scales need one k and one v scale per KV head, got "
                             f"{k.numel()} and {v.numel()}")
        shared = bool((k == k[0]).all()) and bool((v == v[0]).all())
        return cls(k, v, (float(k[0]), float(v[0])) if shared else None)

    @classmethod
    def ones(cls, num_kv_heads: int) -> KVScales:
        """Scales of 1.0 (vLLM's default where a checkpoint has none), on the host."""
        return cls.of(torch.ones(num_kv_heads), torch.ones(num_kv_heads))

    @property
    def num_kv_heads(self) -> int:
        return self.k.shape[0]

    def heads(self, kv_heads: range) -> KVScales:
        """The scales of KV heads `kv_heads` (a tensor-parallel rank's), from host tensors."""
        return KVScales.of(self.k[kv_heads.start:kv_heads.stop],
                           self.v[kv_heads.start:kv_heads.stop])

    def to(self, device: torch.device | str) -> KVScales:
        return KVScales(self.k.to(device), self.v.to(device), self.per_tensor)


@runtime_checkable
class AttentionBackend(Protocol):
    """Registered through `openinfer_register_attention_backends`. Stateless between steps.

    What a backend may offer beyond `attend` it declares by implementing a protocol: CUDA
    graphs (`capabilities.SupportsCudaGraphs`: model lines capture steps only where their
    backend can be) and `SupportsAttendAppended` below."""

    name: str

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
               scale: float, *, kv_scales: KVScales | None = None) -> torch.Tensor:
        """Write this step's `k`, `v` ([T, Hkv, D]) into the caches
        ([num_blocks, block_size, Hkv, D]) at `batch.slot_mapping` (mutates the caches), then
        return causal attention of `q` ([T, Hq, D]) over each request's context, [T, Hq, D].
        Caches in float8_e4m3fn (`--kv-cache-dtype fp8`) store head h's keys / kv_scales.k[h]
        and values / kv_scales.v[h], saturated at +-448, and are read back times those scales
        (vLLM's FP8 KV cache, per tensor or per head; 1.0 without `kv_scales`); model lines
        pass the scales only with such caches, on the caches' device."""
        ...


@runtime_checkable
class SupportsAttendAppended(Protocol):
    """A backend that attends over K/V the model has already written into the caches (fused
    into its q/k norm and rotary kernel, `openinfer_kernels.qk_norm_rope_append`). Model lines
    call it when the backend has it and `attend` otherwise; the openinfer-kernels backends all
    do (their `attend` appends, then calls it: a subclass changes the attention here)."""

    def attend_appended(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        batch: ForwardBatch, scale: float, *,
                        kv_scales: KVScales | None = None) -> torch.Tensor:
        """`attend` for a step whose K/V are already in the caches; mutates nothing."""
        ...


def supports_attend_appended(backend: object) -> TypeIs[SupportsAttendAppended]:
    return isinstance(backend, SupportsAttendAppended)
