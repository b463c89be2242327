"""A step's slot arithmetic (the model's `StepSlots`): each token's request and its slot in a
window group's pool, each query's window of raw-entry slots, the compressed entries a query
sees and the one a token closes. One Triton launch each on CUDA tensors (`triton.py`), the
torch references on CPU (`reference.py`)."""

from __future__ import annotations

from openinfer_deepseek_v4.kernels.indexer.reference import token_requests as token_requests_ref
from openinfer_deepseek_v4.kernels.slots.reference import (
    closed_entry_slots_ref,
    token_slots_ref,
    visible_entry_slots_ref,
    window_slots_ref,
)
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_deepseek_v4.kernels.slots.triton")

token_requests = by_device(token_requests_ref,
                           _kernels.token_requests_triton if _kernels else None)
token_slots = by_device(token_slots_ref, _kernels.token_slots_triton if _kernels else None)
window_slots = by_device(window_slots_ref, _kernels.window_slots_triton if _kernels else None)
visible_entry_slots = by_device(visible_entry_slots_ref,
                                _kernels.visible_entry_slots_triton if _kernels else None)
closed_entry_slots = by_device(closed_entry_slots_ref,
                               _kernels.closed_entry_slots_triton if _kernels else None)

__all__ = ["closed_entry_slots", "closed_entry_slots_ref", "token_requests",
           "token_requests_ref", "token_slots", "token_slots_ref", "visible_entry_slots",
           "visible_entry_slots_ref", "window_slots", "window_slots_ref"]
