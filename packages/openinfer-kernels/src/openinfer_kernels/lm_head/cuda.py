"""The vocabulary projection on CUDA: fp32 logits straight from an fp32 accumulator, so bf16
models get logits without a bf16 rounding (whose step is 0.25 at |logit| >= 32, enough to swap
near-tied tokens) and without a separate conversion pass over [S, V]. cuBLAS
(`torch.mm(..., out_dtype=torch.float32)`), or the Triton small-batch linear where
`gemm.small_batch_tile` picks it (a decode step's few rows)."""

from __future__ import annotations

import torch

from openinfer_kernels.gemm import linear_fp32_out, small_batch_tile
from openinfer_kernels.lm_head.reference import lm_head_logits_ref

_HALF = (torch.bfloat16, torch.float16)


def lm_head_logits_cuda(hidden: torch.Tensor, weight: torch.Tensor,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """`lm_head_logits_ref`'s contract; fp32 accumulate-and-store for bf16/fp16 inputs."""
    if hidden.dtype not in _HALF or weight.dtype != hidden.dtype:
        return lm_head_logits_ref(hidden, weight, out)
    tile = small_batch_tile(hidden, weight)
    if tile is not None:
        return linear_fp32_out(hidden, weight, tile, out)
    try:
        if out is None:
            return torch.mm(hidden, weight.t(), out_dtype=torch.float32)
        return torch.mm(hidden, weight.t(), out_dtype=torch.float32, out=out)
    except TypeError:  # torch before `out_dtype` (2.9): logits rounded to the dtype first
        return lm_head_logits_ref(hidden, weight, out)
