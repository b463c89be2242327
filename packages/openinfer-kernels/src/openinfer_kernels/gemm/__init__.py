"""Linear layers without bias. On CUDA, batches of up to 16 rows at the shapes of `tiles.TILES`
run the Triton small-batch kernels on the GPUs the table was measured on (compute capability
9.0: H100, H200); everything else is `F.linear` (cuBLAS on CUDA). OPENINFER_LINEAR=cublas or
=triton overrides the choice on every GPU."""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from openinfer_kernels.activation import silu_and_mul
from openinfer_kernels.dispatch import triton_kernels
from openinfer_kernels.gemm.reference import grouped_linear_ref, linear_ref
from openinfer_kernels.norm import fused_add_rms_norm

if TYPE_CHECKING:
    from openinfer_kernels.gemm.triton import Tile

_kernels = triton_kernels("openinfer_kernels.gemm.triton")
_CHOICE = os.environ.get("OPENINFER_LINEAR") or None
if _CHOICE not in (None, "triton", "cublas"):
    raise ValueError(f"OPENINFER_LINEAR must be 'triton' or 'cublas', not {_CHOICE!r}")


@functools.lru_cache
def triton_linear_on(device_index: int) -> bool:
    """Whether small batches on CUDA device `device_index` run the Triton kernels."""
    if _CHOICE is not None:
        return _CHOICE == "triton"
    return _kernels is not None and torch.cuda.get_device_capability(device_index) == (9, 0)


def small_batch_tile(x: torch.Tensor, w: torch.Tensor, *, sum_fused: bool = False,
                     gated: bool = False) -> Tile | None:
    """The Triton tile for this product, or None where cuBLAS runs it; `sum_fused`: as
    `linear_add_rms_norm` runs it (`tiles.SUM_FUSED_TILES`); `gated`: as `linear_silu_mul`
    does (`tiles.GATED_TILES`)."""
    if not (_kernels is not None and x.is_cuda and x.dim() == 2 and x.stride(1) == 1
            and w.is_contiguous() and triton_linear_on(x.device.index or 0)):
        return None
    from openinfer_kernels.gemm.tiles import tile_for

    return tile_for(x.shape[0], *w.shape, sum_fused=sum_fused, gated=gated)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x: [M, K], w: [N, K] -> [M, N]."""
    tile = small_batch_tile(x, w)
    if tile is not None:
        assert _kernels is not None
        return _kernels.linear_triton(x, w, tile)
    return F.linear(x, w)


def linear_shares(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """`linear(x, w)`'s K shares, unsummed (fp32 [S, M, N]), where it runs a split-K Triton
    tile: their sum in share order rounded to x's dtype is its result, for a kernel that sums
    them itself (a tensor-parallel push all-reduce); None where it does not (nothing run)."""
    tile = small_batch_tile(x, w)
    if tile is None or tile.split_k < 2:
        return None
    assert _kernels is not None
    return _kernels.linear_shares_triton(x, w, tile)


def sum_shares(shares: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`linear_shares`' shares summed in share order, rounded to `dtype`: `linear`'s result."""
    if _kernels is not None and shares.is_cuda:
        return _kernels.sum_shares_triton(shares, dtype)
    return shares.sum(0, dtype=torch.float32).to(dtype)


def linear_fp32_out(x: torch.Tensor, w: torch.Tensor, tile: Tile,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """`linear` through the Triton kernel at `tile` (from `small_batch_tile`), its fp32
    accumulator stored unrounded: [M, N] fp32, into `out` when given."""
    assert _kernels is not None
    return _kernels.linear_triton(x, w, tile, out_dtype=torch.float32, out=out)


def linear_add_rms_norm(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor,
                        norm_weight: torch.Tensor, eps: float
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """`fused_add_rms_norm(linear(x, w), residual, norm_weight, eps)`: where `linear` would run
    a split-K Triton tile, the norm kernel sums the K shares itself (one launch fewer, the same
    numbers). The tile is the one for a fused sum (`tiles.SUM_FUSED_TILES`)."""
    tile = small_batch_tile(x, w, sum_fused=True)
    if tile is not None and tile.split_k > 1:
        assert _kernels is not None
        return _kernels.linear_add_rms_norm_triton(x, w, tile, residual, norm_weight, eps)
    return fused_add_rms_norm(linear(x, w), residual, norm_weight, eps)


def linear_silu_mul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`silu_and_mul(linear(x, w))` for a gated MLP's [gate; up] weight ([2I, K]) -> [M, I],
    in one kernel where `linear` would run Triton."""
    tile = small_batch_tile(x, w, gated=True)
    if tile is not None:
        assert _kernels is not None
        return _kernels.linear_triton(x, w, tile, gated=True)
    return silu_and_mul(F.linear(x, w))


__all__ = ["grouped_linear_ref", "linear", "linear_add_rms_norm", "linear_fp32_out", "linear_ref",
           "linear_shares", "linear_silu_mul", "small_batch_tile", "sum_shares",
           "triton_linear_on"]
