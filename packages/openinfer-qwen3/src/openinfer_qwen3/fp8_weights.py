"""What becomes of Qwen3's block-scaled FP8 linears at load: kept on CUDA as `Fp8BlockWeight`
(e4m3 values + their block scales) for `fp8_dynamic_linear`, which reads half the bytes of
bf16 (the default), or dequantized to the model's dtype (on the CPU, or with
OPENINFER_FP8_WEIGHTS=dequantize). Online quantization (`--quantization fp8`) quantizes each
fused linear of an unquantized checkpoint to that format as it loads, then keeps or
dequantizes it the same way (dequantized: the FP8 model's numbers in the model's dtype).

A kept linear is whole blocks from its first row and column (`skip` 0): a tensor-parallel part
that starts inside a scale block is dequantized. Parts fused into one linear (q/k/v, gate/up)
stay FP8 together only where every part but the last has a whole number of 128-row blocks, so
that each part's scale rows follow the previous part's; otherwise the fusion is dequantized."""

from __future__ import annotations

import os

import torch

from openinfer_core.weights.fp8_checkpoint import Fp8BlockWeight
from openinfer_core.weights.fp8_quantize import quantize_block_fp8
from openinfer_kernels.fp8_linear import block_scales_to_float, dequant_fp8_blocks_ref

# A linear's weight as the forward holds it: a plain tensor, or FP8 kept with its scales.
Linear = torch.Tensor | Fp8BlockWeight

FP8_WEIGHTS_ENV = "OPENINFER_FP8_WEIGHTS"
MODES = ("dequantize", "keep")
# Devices where `keep` keeps FP8 (the CPU runs the dequantized model); a module setting, so
# tests can run the kept path on the CPU.
KEEP_DEVICES = frozenset({"cuda"})
_BLOCK = (128, 128)  # the block `fp8_block_linear` reads
_E8M0 = (torch.uint8, torch.float8_e8m0fnu)


def keep_fp8_weights(device: torch.device, default: str = "keep") -> bool:
    """Whether FP8 linears stay FP8 on `device`: OPENINFER_FP8_WEIGHTS (`dequantize` or
    `keep`; unset: `default`) asks for it and the device is one where FP8 kernels run. Kept
    is the default: on an H100, Qwen3-8B FP8 kept decodes in 3.69 ms against 5.66 dequantized
    and takes its first 2048-token step in 35.6 ms against 46.2 (benchmarks/device/stages/
    fp8.sh)."""
    mode = os.environ.get(FP8_WEIGHTS_ENV) or default
    if mode not in MODES:
        raise ValueError(f"{FP8_WEIGHTS_ENV} must be one of {', '.join(MODES)}, not {mode!r}")
    return mode == "keep" and device.type in KEEP_DEVICES


def fuse(parts: list[torch.Tensor | Fp8BlockWeight], *, dtype: torch.dtype,
         keep: bool, quantize: bool = False) -> tuple[Linear, str | None]:
    """The linear of `parts` stacked by rows (one part: itself), and, where `keep` asked for
    FP8 that could not stay FP8, why it was dequantized. FP8 parts are dequantized to `dtype`
    unless kept. With `quantize`, plain parts are stacked, then quantized to 128 x 128 block-
    scaled FP8 (kept, or dequantized again to `dtype`)."""
    fp8 = [p for p in parts if isinstance(p, Fp8BlockWeight)]
    if not fp8 and quantize:
        quantized = quantize_block_fp8(_cat([p for p in parts if isinstance(p, torch.Tensor)]),
                                       _BLOCK)
        return (quantized if keep else dequantized(quantized, dtype)), None
    if not fp8:
        return _cat([p for p in parts if isinstance(p, torch.Tensor)]), None
    why = _why_not_kept(parts) if keep else None
    if keep and why is None:
        return _kept(fp8), None
    return _cat([dequantized(p, dtype) if isinstance(p, Fp8BlockWeight) else p
                 for p in parts]), why


def _why_not_kept(parts: list[torch.Tensor | Fp8BlockWeight]) -> str | None:
    for n, part in enumerate(parts):
        if not isinstance(part, Fp8BlockWeight):
            return "a part of it is not FP8"
        if part.block != _BLOCK:
            return f"its scale blocks are {list(part.block)}, not {list(_BLOCK)}"
        if part.skip:
            return "a tensor-parallel part starts inside a scale block"
        if n < len(parts) - 1 and part.weight.shape[0] % _BLOCK[0]:
            return (f"a part's {part.weight.shape[0]} rows are not a whole number of "
                    f"{_BLOCK[0]}-row blocks")
    return None


def _kept(parts: list[Fp8BlockWeight]) -> Fp8BlockWeight:
    """One FP8 linear of whole-block parts: e4m3 rows and scale rows stacked, scales E8M0 or
    float32 (bf16 / fp16 widened, exactly; mixed formats all as float32)."""
    scales = [p.scale for p in parts]
    if not all(s.dtype in _E8M0 for s in scales):
        scales = [block_scales_to_float(s) for s in scales]
    weight = parts[0].weight if len(parts) == 1 else torch.cat([p.weight for p in parts])
    scale = scales[0] if len(scales) == 1 else torch.cat(scales)
    return Fp8BlockWeight(weight.contiguous(), scale.contiguous(), parts[0].block)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def dequantized(w: Fp8BlockWeight, dtype: torch.dtype) -> torch.Tensor:
    """An FP8 weight (or its part) in `dtype`: each e4m3 value times its block's scale, in fp32,
    rounded once."""
    rows, cols = w.block
    if rows != cols:
        raise ValueError(f"square scale blocks only, got {list(w.block)}")
    whole = dequant_fp8_blocks_ref(w.weight, w.scale, rows, dtype)
    if not w.skip:
        return whole
    return whole.narrow(w.dim, w.skip, whole.shape[w.dim] - w.skip).contiguous()


def nbytes(w: Linear | None) -> int:
    """Bytes a product reads of `w`: an FP8 linear's e4m3 values and its scales."""
    if w is None:
        return 0
    if isinstance(w, Fp8BlockWeight):
        return nbytes(w.weight) + nbytes(w.scale)
    return w.numel() * w.element_size()
