"""Linear layers over block-scaled FP8 weights (e4m3, one scale per 128 x 128 block: E8M0, or
float32 as HF's `weight_scale_inv`) that keep the weight quantized on the GPU:
`fp8_block_linear` (activations bf16 or fp32, the weight dequantized in registers), its
decode-step fusions `fp8_block_linear_silu_mul` (a gated MLP's [gate; up] product and its
activation) and `fp8_block_linear_add_rms_norm` (the product, then the residual add +
RMSNorm, a split product's shares summed by the norm kernel), and `fp8_grouped_linear` for a
block-diagonal one; the W8A8 pair for many rows, `fp8_group_quant` (activations to e4m3 per
row and 128-column group) and `fp8_w8a8_linear` (e4m3 x e4m3 on the FP8 tensor cores:
cuBLASLt's block-scaled product where it applies, `scaled_mm.py`, else Triton); and
`fp8_dynamic_linear`, which picks between the two by the row count (`dynamic.py`), or takes
an activation quantized already (`Fp8Activation`) by `rms_norm_group_quant`,
`add_rms_norm_group_quant` or `silu_mul_group_quant`: the kernel that makes the activation
quantizes it too (`quant_fused.py`). The references on CPU, the Triton kernels on CUDA.
`dequant_fp8_blocks_ref` dequantizes a weight."""

from openinfer_kernels.dispatch import by_device, triton_kernels
from openinfer_kernels.fp8_linear.dynamic import (
    FP8_LINEAR_ENV,
    Fp8Activation,
    dynamic_linear,
    quantizes_activations,
)
from openinfer_kernels.fp8_linear.reference import (
    add_rms_norm_group_quant_ref,
    block_scales_to_float,
    dequant_fp8_blocks_ref,
    e8m0_to_float,
    fp8_block_linear_add_rms_norm_ref,
    fp8_block_linear_ref,
    fp8_block_linear_silu_mul_ref,
    fp8_group_quant_ref,
    fp8_grouped_linear_ref,
    fp8_w8a8_linear_ref,
    rms_norm_group_quant_ref,
    silu_mul_group_quant_ref,
)

_kernels = triton_kernels("openinfer_kernels.fp8_linear.triton")
_w8a8 = triton_kernels("openinfer_kernels.fp8_linear.w8a8_triton")
_scaled_mm = triton_kernels("openinfer_kernels.fp8_linear.scaled_mm")
_fused = triton_kernels("openinfer_kernels.fp8_linear.quant_fused")

fp8_block_linear = by_device(fp8_block_linear_ref,
                             _kernels.fp8_block_linear_triton if _kernels else None)
fp8_block_linear_silu_mul = by_device(
    fp8_block_linear_silu_mul_ref, _kernels.fp8_block_linear_silu_mul_triton if _kernels else None)
fp8_block_linear_add_rms_norm = by_device(
    fp8_block_linear_add_rms_norm_ref,
    _kernels.fp8_block_linear_add_rms_norm_triton if _kernels else None)
fp8_grouped_linear = by_device(fp8_grouped_linear_ref,
                               _kernels.fp8_grouped_linear_triton if _kernels else None)
fp8_group_quant = by_device(fp8_group_quant_ref,
                            _w8a8.fp8_group_quant_triton if _w8a8 else None)
rms_norm_group_quant = by_device(rms_norm_group_quant_ref,
                                _fused.rms_norm_group_quant_triton if _fused else None)
add_rms_norm_group_quant = by_device(add_rms_norm_group_quant_ref,
                                    _fused.add_rms_norm_group_quant_triton if _fused else None)
silu_mul_group_quant = by_device(silu_mul_group_quant_ref,
                                 _fused.silu_mul_group_quant_triton if _fused else None)
# cuBLASLt's block-scaled FP8 product where it applies (`scaled_mm.py`), else the Triton one.
fp8_w8a8_linear = by_device(fp8_w8a8_linear_ref,
                            _scaled_mm.fp8_w8a8_linear_cuda if _scaled_mm else None)
# Each op it calls dispatches by device, so this one does too.
fp8_dynamic_linear = dynamic_linear(fp8_block_linear, fp8_group_quant, fp8_w8a8_linear)

__all__ = ["FP8_LINEAR_ENV", "Fp8Activation", "add_rms_norm_group_quant",
           "add_rms_norm_group_quant_ref", "block_scales_to_float", "dequant_fp8_blocks_ref",
           "dynamic_linear", "e8m0_to_float", "fp8_block_linear",
           "fp8_block_linear_add_rms_norm", "fp8_block_linear_add_rms_norm_ref",
           "fp8_block_linear_ref", "fp8_block_linear_silu_mul", "fp8_block_linear_silu_mul_ref",
           "fp8_dynamic_linear", "fp8_group_quant", "fp8_group_quant_ref", "fp8_grouped_linear",
           "fp8_grouped_linear_ref", "fp8_w8a8_linear", "fp8_w8a8_linear_ref",
           "quantizes_activations", "rms_norm_group_quant", "rms_norm_group_quant_ref",
           "silu_mul_group_quant", "silu_mul_group_quant_ref"]
