"""Block-scaled FP8 and FP4 weights (DeepSeek-V4's checkpoint formats): the reference
dequantization. No Triton kernel yet."""

from openinfer_kernels.quant.reference import (
    E2M1_VALUES,
    dequant_fp4_ref,
    dequant_fp8_blocks_ref,
    e8m0_to_float,
)

__all__ = ["E2M1_VALUES", "dequant_fp4_ref", "dequant_fp8_blocks_ref", "e8m0_to_float"]
