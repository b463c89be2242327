"""A tiny unquantized Qwen3 checkpoint (bf16, random weights of the "whole-blocks" shapes) for
the online-quantization tests, and its FP8 twin quantized here (`fp8_checkpoints.quantize`,
per part: q, k, v, gate and up are whole 128-row blocks, so the blocks are those of the fused
linears that `--quantization fp8` quantizes)."""

from __future__ import annotations

from pathlib import Path

import torch
from fp8_checkpoints import FP8_CONFIG, SPECS, quantize, write_folder

from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.random_weights import tensor_shapes

SPEC = SPECS["whole-blocks"]


def write_bf16_and_fp8(root: Path) -> tuple[Path, Path]:
    """(the bf16 checkpoint, the same weights with each linear quantized to block FP8)."""
    cfg = Qwen3Config.from_dict(SPEC)
    gen = torch.Generator().manual_seed(3)
    plain: dict[str, torch.Tensor] = {}
    fp8: dict[str, torch.Tensor] = {}
    for name, shape in tensor_shapes(cfg).items():
        values = torch.randn(shape, generator=gen)
        values = 1.0 + 0.2 * values if name.endswith("norm.weight") else 0.25 * values
        plain[name] = values.to(torch.bfloat16)
        if name.endswith("_proj.weight"):
            q, scale = quantize(plain[name].float())
            fp8[name], fp8[name.removesuffix("weight") + "weight_scale_inv"] = q, scale
        else:
            fp8[name] = plain[name]
    return (write_folder(root / "bf16", SPEC, plain, None),
            write_folder(root / "fp8", SPEC, fp8, FP8_CONFIG))
