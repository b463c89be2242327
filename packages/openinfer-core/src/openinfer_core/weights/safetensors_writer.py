"""Safetensors checkpoints written a tensor at a time, without numpy (which
`safetensors.torch.save_file` needs and openinfer does not install): the demo checkpoints'
weights and the full-size random checkpoints of the GPU checks. Sharded like
`save_pretrained`, with an index, past `max_shard_bytes`."""

from __future__ import annotations

import ctypes
import json
import logging
import math
import struct
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("openinfer.weights")

MAX_SHARD_BYTES = 2 << 30

_DTYPE_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
                torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.int8: "I8",
                torch.float8_e4m3fn: "F8_E4M3"}

MakeTensor = Callable[[str], torch.Tensor]


def write_safetensors(dest: Path, shapes: Mapping[str, tuple[int, ...]],
                      dtypes: Mapping[str, torch.dtype], make: MakeTensor, *,
                      max_shard_bytes: int = MAX_SHARD_BYTES) -> None:
    """Tensors `make(name)` for each name of `shapes` (in that order; each must have its
    planned shape, and is stored in `dtypes[name]`) into `dest`: `model.safetensors`, or
    `model-0000k-of-0000n.safetensors` shards and `model.safetensors.index.json`."""
    shards = _plan_shards(shapes, dtypes, max_shard_bytes)
    weight_map: dict[str, str] = {}
    for k, names in enumerate(shards, start=1):
        file_name = ("model.safetensors" if len(shards) == 1
                     else f"model-{k:05d}-of-{len(shards):05d}.safetensors")
        if len(shards) > 1:
            log.info("random weights: shard %d of %d", k, len(shards))
        _save_file(dest / file_name, {n: shapes[n] for n in names}, dtypes, make)
        weight_map.update(dict.fromkeys(names, file_name))
    if len(shards) > 1:
        total = sum(_nbytes(shapes[n], dtypes[n]) for n in shapes)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _save_file(path: Path, shapes: Mapping[str, tuple[int, ...]],
               dtypes: Mapping[str, torch.dtype], make: MakeTensor) -> None:
    if sys.byteorder != "little":
        raise RuntimeError("writing safetensors raw needs a little-endian machine")
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        nbytes = _nbytes(shape, dtypes[name])
        header[name] = {"dtype": _DTYPE_NAMES[dtypes[name]], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format lets the header pad to keep data aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape in shapes.items():
            tensor = make(name).to(dtypes[name]).contiguous()
            if tuple(tensor.shape) != shape:
                raise AssertionError(f"{name}: made {tuple(tensor.shape)}, planned {shape}")
            nbytes = tensor.numel() * tensor.element_size()
            if nbytes:  # the tensor's own memory, little-endian like the format
                f.write((ctypes.c_char * nbytes).from_address(tensor.data_ptr()))


def _plan_shards(shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, torch.dtype],
                 max_shard_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = _nbytes(shape, dtypes[name])
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize
