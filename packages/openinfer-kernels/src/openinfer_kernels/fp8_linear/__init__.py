"""Linear layers over block-scaled FP8 weights (e4m3, one scale per 128 x 128 block: E8M0, or
float32 as HF's `weight_scale_inv`) that keep the weight quantized on the GPU:
`fp8_block_linear`, and `fp8_grouped_linear` for a block-diagonal one; the references on CPU,
the Triton kernel (the weight dequantized in registers, activations bf16 or fp32) on CUDA.
`dequant_fp8_blocks_ref` dequantizes a weight."""

from openinfer_kernels.dispatch import by_device, triton_kernels
from openinfer_kernels.fp8_linear.reference import (
    block_scales_to_float,
    dequant_fp8_blocks_ref,
    e8m0_to_float,
    fp8_block_linear_ref,
    fp8_grouped_linear_ref,
)

_kernels = triton_kernels("openinfer_kernels.fp8_linear.triton")

fp8_block_linear = by_device(fp8_block_linear_ref,
                             _kernels.fp8_block_linear_triton if _kernels else None)
fp8_grouped_linear = by_device(fp8_grouped_linear_ref,
                               _kernels.fp8_grouped_linear_triton if _kernels else None)

__all__ = ["block_scales_to_float", "dequant_fp8_blocks_ref", "e8m0_to_float",
           "fp8_block_linear", "fp8_block_linear_ref", "fp8_grouped_linear",
           "fp8_grouped_linear_ref"]
