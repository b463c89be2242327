"""Linear layers without bias. On CUDA, batches of up to 16 rows at the shapes of `tiles.TILES`
run the Triton small-batch kernels when OPENINFER_LINEAR=triton (being validated on the GPU,
issue 13); everything else is `F.linear` (cuBLAS on CUDA)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from openinfer_kernels.activation import silu_and_mul
from openinfer_kernels.dispatch import triton_kernels
from openinfer_kernels.gemm.reference import linear_ref

if TYPE_CHECKING:
    from openinfer_kernels.gemm.triton import Tile

_kernels = triton_kernels("openinfer_kernels.gemm.triton")
_USE_TRITON = os.environ.get("OPENINFER_LINEAR", "cublas") == "triton"


def small_batch_tile(x: torch.Tensor, w: torch.Tensor) -> Tile | None:
    """The Triton tile for this product, or None where cuBLAS runs it."""
    if not (_USE_TRITON and _kernels is not None and x.is_cuda and x.dim() == 2
            and x.stride(1) == 1 and w.is_contiguous()):
        return None
    from openinfer_kernels.gemm.tiles import tile_for

    return tile_for(x.shape[0], *w.shape)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x: [M, K], w: [N, K] -> [M, N]."""
    tile = small_batch_tile(x, w)
    if tile is not None:
        assert _kernels is not None
        return _kernels.linear_triton(x, w, tile)
    return F.linear(x, w)


def linear_fp32_out(x: torch.Tensor, w: torch.Tensor, tile: Tile) -> torch.Tensor:
    """`linear` through the Triton kernel at `tile` (from `small_batch_tile`), its fp32
    accumulator stored unrounded: [M, N] fp32."""
    assert _kernels is not None
    return _kernels.linear_triton(x, w, tile, out_dtype=torch.float32)


def linear_silu_mul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`silu_and_mul(linear(x, w))` for a gated MLP's [gate; up] weight ([2I, K]) -> [M, I],
    in one kernel where `linear` would run Triton."""
    tile = small_batch_tile(x, w)
    if tile is not None:
        assert _kernels is not None
        return _kernels.linear_triton(x, w, tile, gated=True)
    return silu_and_mul(F.linear(x, w))


__all__ = ["linear", "linear_fp32_out", "linear_ref", "linear_silu_mul",
           "small_batch_tile"]
