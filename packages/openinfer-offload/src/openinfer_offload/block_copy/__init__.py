"""Moving whole KV blocks between the paged device tensors and a block-major staging buffer
(`[n, block_bytes]` bytes: block i's slice of tensor 0, then of tensor 1, ...). A Triton kernel
on CUDA does every tensor in one launch; the plain-torch reference runs on CPU and checks it."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from openinfer_offload.block_copy.reference import gather_blocks_ref, scatter_blocks_ref


def _kernels() -> ModuleType | None:
    try:
        from openinfer_offload.block_copy import triton as kernels
    except ModuleNotFoundError as error:
        if error.name != "triton":
            raise
        return None
    return kernels


def gather_blocks(tensors: Sequence[torch.Tensor], ids: torch.Tensor, out: torch.Tensor) -> None:
    """`out[i]` = block `ids[i]` of every tensor, as bytes."""
    kernels = _kernels() if out.is_cuda else None
    if kernels is not None and kernels.supports(tensors):
        kernels.gather_blocks(tensors, ids, out)
    else:
        gather_blocks_ref(tensors, ids, out)


def scatter_blocks(src: torch.Tensor, ids: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Block `ids[i]` of every tensor = `src[i]` (the inverse of `gather_blocks`)."""
    kernels = _kernels() if src.is_cuda else None
    if kernels is not None and kernels.supports(tensors):
        kernels.scatter_blocks(src, ids, tensors)
    else:
        scatter_blocks_ref(src, ids, tensors)
