"""Random-weight Qwen3 safetensors at a config's real shapes, written without transformers
or numpy: the demo checkpoint's weights, and full-size checkpoints for the GPU golden gate
(transformers and openinfer read the same files)."""

from __future__ import annotations

import ctypes
import json
import logging
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from openinfer_core.errors import ModelConfigError
from openinfer_core.model_config import read_model_config
from openinfer_qwen3.config import Qwen3Config

log = logging.getLogger("openinfer.qwen3")

MAX_SHARD_BYTES = 2 << 30

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def tensor_shapes(cfg: Qwen3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of a HuggingFace Qwen3ForCausalLM checkpoint, by name, in file order."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        attn = p + "self_attn."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[attn + "q_proj.weight"] = (cfg.q_size, h)
        shapes[attn + "k_proj.weight"] = (cfg.kv_size, h)
        shapes[attn + "v_proj.weight"] = (cfg.kv_size, h)
        if cfg.attention_bias:
            shapes[attn + "q_proj.bias"] = (cfg.q_size,)
            shapes[attn + "k_proj.bias"] = (cfg.kv_size,)
            shapes[attn + "v_proj.bias"] = (cfg.kv_size,)
        shapes[attn + "q_norm.weight"] = (d,)
        shapes[attn + "k_norm.weight"] = (d,)
        shapes[attn + "o_proj.weight"] = (h, cfg.q_size)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (i, h)
        shapes[p + "mlp.up_proj.weight"] = (i, h)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
    shapes["model.norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


def write_weights(cfg: Qwen3Config, dest: Path, *, std: float, dtype: torch.dtype,
                  seed: int = 0) -> None:
    """Random safetensors for `cfg` in `dest`: one file, or shards with an index past
    `MAX_SHARD_BYTES`. Norm weights are near 1, everything else normal with `std`; the same
    seed gives the same tensors on every machine (one CPU generator, drawn in file order)."""
    shapes = tensor_shapes(cfg)
    shards = _plan_shards(shapes, dtype.itemsize)
    gen = torch.Generator().manual_seed(seed)

    def make(name: str) -> torch.Tensor:
        values = torch.randn(shapes[name], generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            return 1.0 + 0.1 * values
        return (0.1 if name.endswith(".bias") else std) * values

    weight_map: dict[str, str] = {}
    for k, names in enumerate(shards, start=1):
        file_name = ("model.safetensors" if len(shards) == 1
                     else f"model-{k:05d}-of-{len(shards):05d}.safetensors")
        if len(shards) > 1:
            log.info("random weights: shard %d of %d", k, len(shards))
        _save_safetensors(dest / file_name, {n: shapes[n] for n in names}, dtype, make)
        weight_map.update(dict.fromkeys(names, file_name))
    if len(shards) > 1:
        total = sum(_numel(s) for s in shapes.values()) * dtype.itemsize
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def write_random_weights(config_dir: Path, dest: Path) -> None:
    """Random safetensors in `dest` (for tests and GPU checks) with exactly the tensor names,
    shapes and dtype that the config.json in `config_dir` calls for (std from its
    `initializer_range`, as transformers initialises)."""
    config = read_model_config(config_dir)
    cfg = Qwen3Config.from_dict(config)
    dtype_name = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    dtype = _DTYPES.get(dtype_name)
    if dtype is None:
        raise ModelConfigError(
            f"config.json: torch_dtype {dtype_name!r} is not one of {', '.join(_DTYPES)}")
    std = float(config.get("initializer_range", 0.02))
    log.info("writing random %s weights for %s into %s", dtype_name, config_dir, dest)
    write_weights(cfg, Path(dest), std=std, dtype=dtype)


def _save_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype,
                      make: Callable[[str], torch.Tensor]) -> None:
    """A safetensors file written one tensor at a time, so a full-size dummy checkpoint never
    sits in memory whole; and without numpy, which `safetensors.torch.save_file` needs but
    openinfer does not install."""
    if sys.byteorder != "little":
        raise RuntimeError("writing safetensors raw needs a little-endian machine")
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        nbytes = _numel(shape) * dtype.itemsize
        header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format lets the header pad to keep data aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape in shapes.items():
            tensor = make(name).to(dtype).contiguous()
            if tuple(tensor.shape) != shape:
                raise AssertionError(f"{name}: made {tuple(tensor.shape)}, planned {shape}")
            nbytes = tensor.numel() * tensor.element_size()
            if nbytes:  # the tensor's own memory, little-endian like the format
                f.write((ctypes.c_char * nbytes).from_address(tensor.data_ptr()))


def _plan_shards(shapes: dict[str, tuple[int, ...]], itemsize: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = _numel(shape) * itemsize
        if shards[-1] and size + nbytes > MAX_SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
