# mypy: disable-error-code="no-untyped-def"
"""A vocabulary part's embedding lookup in one launch (`embedding_part_ref`'s contract): in
torch ops it is a subtraction, two comparisons, an or, two masked fills and the gather, seven
launches of a tensor-parallel decode step. (The mypy line above: @triton.jit functions annotate
only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer_kernels.pdl import pdl_enter, pdl_launch


@triton.jit
def _embedding_part_kernel(ids_ptr, weight_ptr, out_ptr, start, rows, hidden, stride_w,
                           BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    local = tl.zeros([BLOCK_H], tl.int64) + tl.load(ids_ptr + t).to(tl.int64) - start
    inside = (local >= 0) & (local < rows)
    ok = cols < hidden
    row = tl.load(weight_ptr + tl.where(inside, local, 0) * stride_w + cols, mask=ok & inside,
                  other=0.0)
    tl.store(out_ptr + t * hidden + cols, row, mask=ok)


def embedding_part_triton(token_ids: torch.Tensor, weight: torch.Tensor,
                          start: int) -> torch.Tensor:
    """`embedding_part_ref` in one launch: token_ids [T] (int32 or int64), weight [V_part, H]
    with contiguous rows."""
    if weight.dim() != 2 or weight.stride(1) != 1 or token_ids.dim() != 1:
        raise ValueError(f"embedding_part: need token_ids [T] and weight [V, H] with contiguous "
                         f"rows, got {tuple(token_ids.shape)} and {tuple(weight.shape)} "
                         f"strides {weight.stride()}")
    t, (rows, hidden) = token_ids.shape[0], weight.shape
    out = torch.empty((t, hidden), dtype=weight.dtype, device=weight.device)
    if t:
        block = min(1024, triton.next_power_of_2(hidden))
        _embedding_part_kernel[(t, triton.cdiv(hidden, block))](
            token_ids, weight, out, start, rows, hidden, weight.stride(0), BLOCK_H=block,
            num_warps=4, **pdl_launch(out))
    return out
