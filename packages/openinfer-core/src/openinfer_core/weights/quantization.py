"""config.json's `quantization_config`, read for a model line: what it declares, checked
against what the line implements, so a checkpoint the line would misread is refused at
start-up with what was found and what is supported.

Two FP8 schemes are understood: HF's fine-grained FP8 (transformers' `FineGrainedFP8Config`,
the layout of Qwen3-*-FP8 and DeepSeek-V3), `quant_method: fp8` with `weight_block_size`
(`BlockFp8`); and FP8 with one scale per output channel or per tensor (`ChannelFp8`):
`quant_method: fp8` without `weight_block_size` (vLLM's per-tensor FP8), or llm-compressor's
`compressed-tensors` FP8 (`FP8_DYNAMIC`, `FP8`: the common published per-channel form).

`--quantization` (vLLM's flag) asks a model line to quantize an unquantized checkpoint at load
(`QUANTIZATION_METHODS`; `online_method` checks the request against config.json)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from openinfer_core.errors import ModelConfigError

# `--quantization` values: quantize an unquantized checkpoint's linears at load. fp8: to the
# block-scaled e4m3 format of `BlockFp8` (128 x 128 blocks), so FP8 checkpoints' kernels run.
QUANTIZATION_METHODS = ("fp8",)

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


@dataclass(frozen=True, slots=True)
class ChannelFp8:
    """FP8 weights with one float scale per output channel or one per tensor: each quantized
    linear's `weight` is e4m3 [O, I] beside a `weight_scale` of shape [O, 1], [O], [1] or []
    (the dequantized weight is the e4m3 value times its row's scale). Activations, where the
    checkpoint quantizes them, are quantized at run time per token ('dynamic'); none are
    stored."""

    scheme: str  # what config.json declared: "fp8" or "compressed-tensors"


def channel_scale_name(weight_name: str) -> str:
    """The channel (or tensor) scale of a quantized `<module>.weight`: `<module>.weight_scale`."""
    return weight_name.removesuffix(".weight") + ".weight_scale"


Fp8Scheme = BlockFp8 | ChannelFp8

# compressed-tensors' top-level keys that change nothing in how the tensors are read.
_CT_KEYS = frozenset({"quant_method", "format", "config_groups", "ignore", "kv_cache_scheme",
                      "quantization_status", "global_compression_ratio", "sparsity_config",
                      "transform_config", "version"})
# A group's weights: 8-bit floats, symmetric, scales stored (not dynamic), per channel or tensor.
_CT_WEIGHTS = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}


def fp8_config(config: Mapping[str, Any], *, line: str,
               block: tuple[int, int] = (128, 128)) -> Fp8Scheme | None:
    """The FP8 scheme config.json declares (block-scaled or per-channel), or None when it
    declares no quantization; anything else raises ModelConfigError naming the setting."""
    raw = config.get("quantization_config")
    if raw is None:
        return None
    method = raw.get("quant_method") if isinstance(raw, Mapping) else None
    if method == "compressed-tensors":
        return _compressed_tensors_fp8(raw, line)
    if method != "fp8":
        what = (f"quantization_config.quant_method {method!r}" if isinstance(raw, Mapping)
                else f"quantization_config {raw!r} (not an object)")
        raise _refusal(line, what, block)
    _check_fp8_keys(raw, line, block)
    if raw.get("weight_block_size") is None:
        return ChannelFp8("fp8")
    return block_fp8_config(config, line=line, block=block)


def _refusal(line: str, what: str, block: tuple[int, int]) -> ModelConfigError:
    return ModelConfigError(
        f"config.json: {what} is not supported by the {line} model line (supported: fp8 with "
        f"weight_block_size {list(block)}, fp8 with per-tensor or per-channel weight scales, "
        "compressed-tensors FP8 with per-channel or per-tensor weight scales, each with "
        "dynamic or no activation quantization; or no quantization_config)")


def _check_fp8_keys(raw: Mapping[str, Any], line: str, block: tuple[int, int]) -> None:
    unknown = sorted(set(raw) - _FP8_KEYS)
    if unknown:
        raise _refusal(line, f"quantization_config with {', '.join(map(repr, unknown))}", block)
    if raw.get("fmt", "e4m3") != "e4m3":
        raise _refusal(line, f"quantization_config.fmt {raw.get('fmt')!r}", block)
    if raw.get("activation_scheme", "dynamic") != "dynamic":
        raise _refusal(line, "quantization_config.activation_scheme "
                             f"{raw.get('activation_scheme')!r}", block)


def _compressed_tensors_fp8(raw: Mapping[str, Any], line: str) -> ChannelFp8:
    """llm-compressor's FP8 schemes (FP8_DYNAMIC, FP8): every config group's weights FP8 with
    channel or tensor scales, its input activations dynamic per token (or tensor) or none."""
    block = (128, 128)

    def refuse(what: str) -> ModelConfigError:
        return _refusal(line, f"compressed-tensors {what}", block)

    unknown = sorted(set(raw) - _CT_KEYS)
    if unknown:
        raise refuse(f"quantization_config with {', '.join(map(repr, unknown))}")
    if raw.get("format") not in ("float-quantized", None):
        raise refuse(f"format {raw.get('format')!r} (only 'float-quantized')")
    if raw.get("kv_cache_scheme") is not None:
        raise refuse("kv_cache_scheme (stored KV cache scales)")
    if raw.get("sparsity_config"):
        raise refuse("sparsity_config")
    groups = raw.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise refuse("quantization_config without config_groups")
    for name, group in groups.items():
        if not isinstance(group, Mapping):
            raise refuse(f"config group {name!r} (not an object)")
        weights = group.get("weights") or {}
        for key, want in _CT_WEIGHTS.items():
            if weights.get(key) != want:
                raise refuse(f"config group {name!r} weights.{key} {weights.get(key)!r}")
        if weights.get("strategy") not in ("channel", "tensor"):
            raise refuse(f"config group {name!r} weights.strategy {weights.get('strategy')!r}")
        acts = group.get("input_activations")
        if acts is not None and not _dynamic_fp8(acts):
            raise refuse(f"config group {name!r} input_activations {acts!r} (only "
                         "dynamic FP8 per token or tensor)")
        if group.get("output_activations") is not None:
            raise refuse(f"config group {name!r} output_activations")
    return ChannelFp8("compressed-tensors")


def _dynamic_fp8(acts: object) -> bool:
    """compressed-tensors input activations quantized to FP8 at run time, per token or tensor
    (the FP8 kernels' per-token-group quantization, or none where weights are dequantized)."""
    return (isinstance(acts, Mapping) and acts.get("type") == "float"
            and acts.get("num_bits") == 8 and acts.get("dynamic") is True
            and acts.get("strategy") in ("token", "tensor"))


def online_method(requested: str | None, config: Mapping[str, Any]) -> str | None:
    """The quantization to apply at load for `--quantization requested`: None when none was
    asked for or the checkpoint is already FP8 (nothing to do). A method not implemented, or
    a checkpoint quantized some other way, raises ModelConfigError saying what to do."""
    if requested is None:
        return None
    if requested not in QUANTIZATION_METHODS:
        raise ModelConfigError(
            f"--quantization {requested!r} is not implemented (accepted: "
            f"{', '.join(QUANTIZATION_METHODS)}, or None to load the checkpoint as stored)")
    raw = config.get("quantization_config")
    if raw is None:
        return requested
    method = raw.get("quant_method") if isinstance(raw, Mapping) else raw
    if method in ("fp8", "compressed-tensors"):
        return None  # already FP8 (the model line checks the details as it reads them)
    raise ModelConfigError(
        f"--quantization {requested} quantizes an unquantized checkpoint at load, but this "
        f"one's config.json declares quantization_config.quant_method {method!r}: leave out "
        "--quantization")
