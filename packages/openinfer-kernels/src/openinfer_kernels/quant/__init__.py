"""Block-scaled FP8 and FP4 weights (DeepSeek-V4's checkpoint formats): the reference
dequantization, and the FP8 linear layer that keeps its weight quantized on the GPU
(`fp8_block_linear`, and `fp8_grouped_linear` for a block-diagonal one: the references on CPU,
the Triton kernel on CUDA)."""

from openinfer_kernels.dispatch import by_device, triton_kernels
from openinfer_kernels.quant.reference import (
    E2M1_VALUES,
    dequant_fp4_ref,
    dequant_fp8_blocks_ref,
    e8m0_to_float,
    fp8_block_linear_ref,
    fp8_grouped_linear_ref,
)

_kernels = triton_kernels("openinfer_kernels.quant.triton")

fp8_block_linear = by_device(fp8_block_linear_ref,
                             _kernels.fp8_block_linear_triton if _kernels else None)
fp8_grouped_linear = by_device(fp8_grouped_linear_ref,
                               _kernels.fp8_grouped_linear_triton if _kernels else None)

__all__ = ["E2M1_VALUES", "dequant_fp4_ref", "dequant_fp8_blocks_ref", "e8m0_to_float",
           "fp8_block_linear", "fp8_block_linear_ref", "fp8_grouped_linear",
           "fp8_grouped_linear_ref"]
