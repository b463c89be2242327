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


class BlockMover:
    """Gathers and scatters for one fixed list of paged tensors; which implementation runs
    is decided once."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.tensors = list(tensors)
        kernels = _kernels() if self.tensors[0].is_cuda else None
        self._kernels = (kernels.Kernels(self.tensors)
                         if kernels is not None and kernels.supports(self.tensors) else None)

    def gather(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        """`out[i]` = block `ids[i]` of every tensor, as bytes."""
        if self._kernels is not None:
            self._kernels.gather(ids, out)
        else:
            gather_blocks_ref(self.tensors, ids, out)

    def scatter(self, src: torch.Tensor, ids: torch.Tensor) -> None:
        """Block `ids[i]` of every tensor = `src[i]` (the inverse of `gather`)."""
        if self._kernels is not None:
            self._kernels.scatter(src, ids)
        else:
            scatter_blocks_ref(src, ids, self.tensors)
