"""The W8A8 product on cuBLASLt: `torch._scaled_mm` with 1 x 128 activation scales and
128 x 128 weight scales (block-scaled FP8, Hopper), where it applies; the repo's Triton W8A8
kernel elsewhere. On an H100 cuBLASLt ran Qwen3-8B's prompt products at 1,100-1,170 TFLOP/s
from 2,048 rows, the Triton kernel at 600-680 (benchmarks/device/fp8_gemm.py --sweep), and
was as fast or faster from 128 rows on.

cuBLASLt's blockwise FP8 takes float32 scales only (not DeepSeek's E8M0 bytes), whole
128-blocks of N and K, bf16 output and, for the activations' scales, the M-major layout
`fp8_group_quant` stores (a [K/128, M] tensor, transposed); anything else goes to Triton."""

from __future__ import annotations

import functools

import torch

from openinfer_kernels.fp8_linear.w8a8_triton import GROUP, fp8_w8a8_linear_triton


@functools.cache
def _is_hopper(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) == (9, 0)


def _padded_rows(xq: torch.Tensor, x_scale: torch.Tensor) -> int:
    """The rows, rounded up to 4, that `fp8_group_quant` allocated behind xq and its scales
    (0 where the storage does not hold them: operands made elsewhere)."""
    m, k = xq.shape
    padded = -(-m // 4) * 4
    if (x_scale.stride(0) != 1 or x_scale.stride(1) != padded or xq.stride(0) != k
            or xq.untyped_storage().nbytes() < (xq.storage_offset() + padded * k)
            or x_scale.untyped_storage().nbytes() < 4 * (x_scale.storage_offset()
                                                         + padded * x_scale.shape[1])):
        return 0
    return padded


def _cublas_rows(xq: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor,
                 scale: torch.Tensor, out_dtype: torch.dtype) -> int:
    """The padded row count cuBLASLt's block-scaled FP8 product runs these operands on, or 0
    where it does not take them."""
    n, k = w.shape
    if not (xq.is_cuda and out_dtype == torch.bfloat16 and scale.dtype == torch.float32
            and n % GROUP == 0 and k % GROUP == 0 and xq.shape[0] > 0
            and _is_hopper(xq.device)):
        return 0
    return _padded_rows(xq, x_scale)


def scaled_mm_applies(xq: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor,
                      scale: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether cuBLASLt's block-scaled FP8 product takes these operands."""
    return _cublas_rows(xq, x_scale, w, scale, out_dtype) > 0


def fp8_w8a8_linear_cuda(xq: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor,
                         scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
                         ) -> torch.Tensor:
    """`fp8_w8a8_linear_ref`'s contract on CUDA: cuBLASLt where `scaled_mm_applies`, the
    Triton W8A8 kernel otherwise. cuBLASLt wants the activation scales [M, K/128] with a row
    stride of exactly M, 16-byte aligned: it runs on the rows padded to 4 (the padding rows'
    outputs, made of unwritten inputs, are cut off)."""
    padded = _cublas_rows(xq, x_scale, w, scale, out_dtype)
    if not padded:
        return fp8_w8a8_linear_triton(xq, x_scale, w, scale, out_dtype)
    m, k = xq.shape
    if padded != m:
        xq = xq.as_strided((padded, k), xq.stride())
        x_scale = x_scale.as_strided((padded, x_scale.shape[1]), x_scale.stride())
    out = torch._scaled_mm(xq, w.t(), x_scale, scale.t(), out_dtype=out_dtype)
    return out[:m] if padded != m else out
