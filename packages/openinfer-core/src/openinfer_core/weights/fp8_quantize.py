"""Online quantization (`--quantization fp8`): `quantize_block_fp8` turns a plain linear
weight into the block-scaled e4m3 layout of HF's FP8 checkpoints (`quantization.BlockFp8`):
per 128 x 128 block, scale = amax / 448 (float32) and value = weight / scale rounded to
nearest e4m3, so each block's largest value maps to e4m3's largest and the dequantized weight
(value x scale) is
within half an e4m3 step of the original (relative 2^-4 in e4m3's normal range, absolute
scale x 2^-10 below it). It runs where the weight is (the GPU at load), in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from openinfer_core.weights.fp8_checkpoint import Fp8BlockWeight

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# A block's amax is taken as at least this, so an all-zero block gets a finite scale.
AMAX_FLOOR = 1e-12


def quantize_block_fp8(w: torch.Tensor, block: tuple[int, int] = (128, 128)) -> Fp8BlockWeight:
    """w [O, I] (any float dtype) -> its e4m3 values [O, I] and float32 block scales
    [ceil(O / rows), ceil(I / columns)]; blocks start at w's first row and column."""
    rows, cols = w.shape
    br, bc = block
    grid = (-(-rows // br), -(-cols // bc))
    padded = F.pad(w.float(), (0, grid[1] * bc - cols, 0, grid[0] * br - rows))
    blocks = padded.view(grid[0], br, grid[1], bc)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=AMAX_FLOOR) / E4M3_MAX
    q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    del blocks, padded
    values = q.view(grid[0] * br, grid[1] * bc)[:rows, :cols].contiguous()
    return Fp8BlockWeight(values, scale.contiguous(), block)

