"""Linear layers without bias. On CUDA, batches of up to 16 rows at the shapes of `tiles.TILES`
run the Triton small-batch kernels when OPENINFER_LINEAR=triton (being validated on the GPU,
issue 13); everything else is `F.linear` (cuBLAS on CUDA)."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from openinfer_kernels.dispatch import triton_kernels
from openinfer_kernels.gemm.reference import linear_ref

_kernels = triton_kernels("openinfer_kernels.gemm.triton")
_USE_TRITON = os.environ.get("OPENINFER_LINEAR", "cublas") == "triton"


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x: [M, K], w: [N, K] -> [M, N]."""
    if _USE_TRITON and _kernels is not None and x.is_cuda and x.dim() == 2:
        from openinfer_kernels.gemm.tiles import tile_for

        tile = tile_for(x.shape[0], *w.shape)
        if tile is not None and x.stride(1) == 1 and w.is_contiguous():
            return _kernels.linear_triton(x, w, tile)
    return F.linear(x, w)


__all__ = ["linear", "linear_ref"]
