"""Block-scaled FP8 weights (DeepSeek-V4's format, spec: shared deepseek-v4.md §10.1): e4m3
values [O, I] and one power-of-two scale per 128 x 128 block, stored as E8M0 (a byte e meaning
2^(e - 127), 255 NaN), [ceil(O/128), ceil(I/128)]. Their dequantization, and the linear layers
that multiply activations by such a weight. Both also take float scales (HF's fine-grained
FP8 layout, Qwen3-*-FP8: a float32 `weight_scale_inv` per block, not a power of two).

E8M0 scales are read as bytes: a numeric cast of E8M0 to an integer type would not give the
exponent."""

from __future__ import annotations

import torch

from openinfer_kernels.activation.reference import silu_and_mul_ref
from openinfer_kernels.norm.reference import fused_add_rms_norm_ref, rms_norm_ref


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 scales (float8_e8m0fnu, or their bytes as uint8) -> fp32 powers of two."""
    exponent = scale.view(torch.uint8).to(torch.int32)
    value = torch.ldexp(torch.ones(exponent.shape, device=scale.device), exponent - 127)
    return torch.where(exponent == 255, torch.full_like(value, float("nan")), value)


def block_scales_to_float(scale: torch.Tensor) -> torch.Tensor:
    """Block scales as fp32 multipliers: E8M0 (float8_e8m0fnu, or its bytes as uint8) decoded,
    float ones (fp32, bf16, fp16) widened."""
    if scale.dtype in (torch.uint8, torch.float8_e8m0fnu):
        return e8m0_to_float(scale)
    if scale.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return scale.float()
    raise TypeError(f"block scales must be E8M0 or float, got {scale.dtype}")


def dequant_fp8_blocks_ref(weight: torch.Tensor, scale: torch.Tensor, block: int = 128,
                           dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """e4m3 [O, I] times its block's scale ([ceil(O/block), ceil(I/block)], E8M0 or float) ->
    [O, I]: the product in fp32, rounded once to `dtype`."""
    rows, cols = weight.shape
    s = block_scales_to_float(scale).repeat_interleave(block, 0)[:rows]
    return (weight.float() * s.repeat_interleave(block, 1)[:, :cols]).to(dtype)


def fp8_block_linear_ref(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                         out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K] (bf16 or fp32) times the dequantized FP8 weight: w [N, K] float8_e4m3fn,
    scale [ceil(N/128), ceil(K/128)] E8M0 (uint8 bytes or float8_e8m0fnu) or float ->
    [M, N] in `out_dtype` (default x's). The product in fp32, rounded once."""
    weight = dequant_fp8_blocks_ref(w, scale, dtype=torch.float32)
    return (x.float() @ weight.t()).to(out_dtype or x.dtype)


def fp8_block_linear_silu_mul_ref(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                                  limit: float | None = None) -> torch.Tensor:
    """A gated MLP's activation over an FP8 [gate; up] weight (w [2I, K]): silu(x @ gate.T) *
    (x @ up.T) -> [M, I] in x's dtype, each product rounded to x's dtype first. `limit`
    (finite, > 0): the gate clamped to at most it and up to +-it before (a clamped SwiGLU)."""
    product = fp8_block_linear_ref(x, w, scale)
    if limit is None or not 0 < limit < float("inf"):
        return silu_and_mul_ref(product)
    gate, up = product.chunk(2, dim=-1)
    clamped = torch.cat([gate.clamp(max=limit), up.clamp(-limit, limit)], dim=-1)
    return silu_and_mul_ref(clamped)


def fp8_block_linear_add_rms_norm_ref(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                                      residual: torch.Tensor, norm_weight: torch.Tensor,
                                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x @ w.T + residual), x @ w.T + residual): the FP8 product (rounded to x's
    dtype), then the pre-norm residual stream's add + norm."""
    return fused_add_rms_norm_ref(fp8_block_linear_ref(x, w, scale), residual, norm_weight, eps)


def fp8_grouped_linear_ref(x: torch.Tensor, w: torch.Tensor,
                           scale: torch.Tensor) -> torch.Tensor:
    """The block-diagonal linear with an FP8 weight: x [M, G, K], w [G R, K] float8_e4m3fn
    (group g's rows g R..(g + 1) R - 1, R a multiple of the 128-row scale block), scale its
    E8M0 blocks -> [M, G, R] in x's dtype: group g's inputs times its own rows, each group
    `fp8_block_linear_ref` of its rows and scales."""
    if x.dim() != 3 or w.shape[0] % (x.shape[1] * 128):
        raise ValueError(f"fp8_grouped_linear: need x [M, G, K] and w [G R, K] with R a "
                         f"multiple of 128; got x {tuple(x.shape)}, w {tuple(w.shape)}")
    groups = x.shape[1]
    rows = w.shape[0] // groups
    per = rows // 128
    return torch.stack([fp8_block_linear_ref(x[:, g], w[g * rows:(g + 1) * rows],
                                             scale[g * per:(g + 1) * per])
                        for g in range(groups)], dim=1)


# The activations' side of the W8A8 product (HF's `activation_scheme: dynamic`, DeepSeek's
# `act_quant`): each row's K columns in groups of GROUP, each group scaled onto e4m3's range.
GROUP = 128  # columns a scale covers: one weight scale block, so a K block has one of each
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# A group's amax is taken as at least this, so an all-zero group gets a finite scale (its
# values quantize to 0) and no division by zero.
AMAX_FLOOR = 1e-10


def fp8_group_quant_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (bf16, fp16 or fp32) -> (e4m3 [M, K], fp32 scales [M, ceil(K/128)]): per row
    and 128-column group, scale = max(amax, AMAX_FLOOR) / 448 and q = x / scale rounded to
    nearest e4m3 (ties to even; |q| <= 448), both divisions in fp32. A last partial group's
    amax is over its own columns. x ~= q * scale, each value within half an e4m3 step."""
    m, k = x.shape
    groups = -(-k // GROUP)
    padded = torch.nn.functional.pad(x.float(), (0, groups * GROUP - k)).view(m, groups, GROUP)
    amax = padded.abs().amax(dim=-1).clamp(min=AMAX_FLOOR)
    # Divided by a tensor, not the Python float: on CUDA torch turns division by a scalar
    # into multiplication by its reciprocal, one ulp off the IEEE quotient at times, and
    # the scales (and values) would then depend on the device.
    scale = amax / torch.full_like(amax, E4M3_MAX)
    q = (padded / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(m, groups * GROUP)[:, :k].contiguous(), scale


def rms_norm_group_quant_ref(x: torch.Tensor, weight: torch.Tensor,
                            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The normed rows quantized for the W8A8 product: `fp8_group_quant_ref(rms_norm_ref(...))`
    (the norm rounded to x's dtype first, as an unfused pair stores it)."""
    return fp8_group_quant_ref(rms_norm_ref(x, weight, eps))


def add_rms_norm_group_quant_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                 eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`fused_add_rms_norm_ref` with its normed output quantized for the W8A8 product:
    (e4m3 values, their scales, x + residual)."""
    normed, summed = fused_add_rms_norm_ref(x, residual, weight, eps)
    q, scale = fp8_group_quant_ref(normed)
    return q, scale, summed


def silu_mul_group_quant_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A gated MLP's activation quantized for the W8A8 product:
    `fp8_group_quant_ref(silu_and_mul_ref(x))`."""
    return fp8_group_quant_ref(silu_and_mul_ref(x))


def fp8_w8a8_linear_ref(xq: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor,
                        scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
                        ) -> torch.Tensor:
    """Quantized activations times a block-scaled FP8 weight: xq [M, K] e4m3 with x_scale
    [M, ceil(K/128)] (`fp8_group_quant`'s), w [N, K] e4m3 with scale [ceil(N/128), ceil(K/128)]
    (E8M0 or float) -> [M, N] in `out_dtype`: both operands dequantized in fp32 (exact for E8M0,
    one fp32 rounding for a float scale), multiplied in fp32, rounded once."""
    x = xq.float() * x_scale.float().repeat_interleave(GROUP, 1)[:, :xq.shape[1]]
    return (x @ dequant_fp8_blocks_ref(w, scale, dtype=torch.float32).t()).to(out_dtype)
