"""From the attention interface's `KVScales` record to the kernels' `k_scale` / `v_scale`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from openinfer_core.interfaces.attention import KVScales


def scale_tensors(kv_scales: KVScales | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(k_scale, v_scale), fp32 [Hkv] each, for the kernels; (None, None) without scales."""
    return (None, None) if kv_scales is None else (kv_scales.k, kv_scales.v)
