"""config.json's `quantization_config`, read for a model line: what it declares, checked
against what the line implements, so a checkpoint the line would misread is refused at
start-up with what was found and what is supported.

Today one scheme is understood: HF's fine-grained FP8 (transformers' `FineGrainedFP8Config`,
the layout of Qwen3-*-FP8 and DeepSeek-V3): `quant_method: fp8` with `weight_block_size`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from openinfer_core.errors import ModelConfigError

# Keys of FineGrainedFP8Config (and its aliases in published configs) that change nothing in
# how the tensors are read: which modules are quantized shows in each tensor's dtype and its
# scale's presence, which the loader checks tensor by tensor.
_LAYOUT_KEYS = frozenset({"modules_to_not_convert", "ignored_layers", "modules_to_convert",
                          "dequantize", "expert_dtype"})
_FP8_KEYS = frozenset({"quant_method", "fmt", "activation_scheme", "weight_block_size",
                       "scale_fmt"}) | _LAYOUT_KEYS


@dataclass(frozen=True, slots=True)
class BlockFp8:
    """Block-scaled FP8 weights: each quantized linear's `weight` is e4m3 [O, I] beside a
    `weight_scale_inv` with one scale per `block` (rows, columns) of it,
    [ceil(O / rows), ceil(I / columns)]; the dequantized weight is the e4m3 value times its
    block's scale. Scales are float multipliers (`scale_fmt` 'float') or E8M0 powers of two
    ('ue8m0'); a loader goes by the scale tensor's dtype. Activations are quantized per token
    group at run time ('dynamic'), so no activation scales are stored."""

    block: tuple[int, int]


def scale_name(weight_name: str) -> str:
    """The block scales of a quantized `<module>.weight`: `<module>.weight_scale_inv`."""
    return weight_name.removesuffix(".weight") + ".weight_scale_inv"


def block_fp8_config(config: Mapping[str, Any], *, line: str,
                     block: tuple[int, int] = (128, 128)) -> BlockFp8 | None:
    """The FP8 scheme config.json declares, or None when it declares no quantization. Any
    other method, or FP8 settings `line` does not implement (another block size, per-tensor
    scales, static activation scales, another FP8 format, keys it does not read), raise
    ModelConfigError naming the setting found and what `line` supports."""
    raw = config.get("quantization_config")
    if raw is None:
        return None
    supported = (f"supported: fp8 with weight_block_size {list(block)} and dynamic "
                 "activations, or no quantization_config")

    def refuse(what: str) -> ModelConfigError:
        return ModelConfigError(f"config.json: {what} is not supported by the {line} model "
                                f"line ({supported})")

    if not isinstance(raw, Mapping):
        raise refuse(f"quantization_config {raw!r} (not an object)")
    method = raw.get("quant_method")
    if method != "fp8":
        raise refuse(f"quantization_config.quant_method {method!r}")
    unknown = sorted(set(raw) - _FP8_KEYS)
    if unknown:
        raise refuse(f"quantization_config with {', '.join(map(repr, unknown))}")
    fmt = raw.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise refuse(f"quantization_config.fmt {fmt!r}")
    activations = raw.get("activation_scheme", "dynamic")
    if activations != "dynamic":
        raise refuse(f"quantization_config.activation_scheme {activations!r}")
    sizes = raw.get("weight_block_size")
    if sizes is None:
        raise refuse("fp8 without weight_block_size (per-tensor scales)")
    if not isinstance(sizes, list | tuple) or list(sizes) != list(block):
        raise refuse(f"quantization_config.weight_block_size {sizes!r}")
    scale_fmt = raw.get("scale_fmt", "float")
    if scale_fmt not in ("float", "ue8m0"):
        raise refuse(f"quantization_config.scale_fmt {scale_fmt!r}")
    return BlockFp8(block=block)
