"""Safetensors checkpoints, single-file or sharded with an index: read memory-mapped, a
tensor at a time; or, with OPENINFER_WEIGHT_READ=shards (being measured on the GPU, issue 13),
a whole shard at a time with large sequential reads straight to the device (`shard_reader`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from openinfer_core.errors import WeightLoadError
from openinfer_core.weights.random_checkpoint import RandomCheckpoint
from openinfer_core.weights.shard_reader import read_shard

INDEX_FILE = "model.safetensors.index.json"
WHOLE_SHARDS = os.environ.get("OPENINFER_WEIGHT_READ", "mmap") == "shards"


class Checkpoint:
    """Tensor name -> shard file; tensors are read on demand from memory-mapped shards."""

    def __init__(self, model_dir: str | Path) -> None:
        self.folder = Path(model_dir)
        self._shard_of = self._index()
        self._handles: dict[str, Any] = {}
        self._read: dict[str, torch.Tensor] = {}  # whole-shard reads not yet taken
        self._shards_read: set[str] = set()
        self.bytes_read = 0  # tensor bytes handed out by `get` and `get_part`

    def _index(self) -> dict[str, str]:
        index_path = self.folder / INDEX_FILE
        if index_path.is_file():
            try:
                weight_map = json.loads(index_path.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise WeightLoadError(
                    f"{index_path} is malformed (need a JSON object with 'weight_map'): {exc}"
                ) from exc
            missing = sorted({f for f in weight_map.values() if not (self.folder / f).is_file()})
            if missing:
                raise WeightLoadError(
                    f"{index_path} names shard files that are missing: {', '.join(missing)}"
                )
            return dict(weight_map)
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise WeightLoadError(
                f"no *.safetensors files in {str(self.folder)!r}; openinfer loads safetensors "
                "checkpoints (convert .bin/.pt weights with transformers' save_pretrained)"
            )
        shard_of: dict[str, str] = {}
        for f in files:
            with self._open(f.name) as handle:
                for name in handle.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    shard_of[name] = f.name
        return shard_of

    def _open(self, file_name: str) -> Any:
        try:
            return safe_open(str(self.folder / file_name), framework="pt", device="cpu")
        except Exception as exc:
            raise WeightLoadError(f"cannot read {self.folder / file_name}: {exc}") from exc

    def _handle(self, name: str) -> Any:
        try:
            file_name = self._shard_of[name]
        except KeyError:
            raise WeightLoadError(
                f"checkpoint {str(self.folder)!r} has no tensor {name!r}"
            ) from None
        if file_name not in self._handles:
            self._handles[file_name] = self._open(file_name)
        return self._handles[file_name]

    def names(self) -> set[str]:
        return set(self._shard_of)

    def __contains__(self, name: object) -> bool:
        return name in self._shard_of

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(name).get_slice(name).get_shape())

    def get(self, name: str, *, shape: tuple[int, ...] | None = None,
            dtype: torch.dtype | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
        """Tensor `name`, checked against `shape`, cast to `dtype`, on `device`."""
        if shape is not None and self.shape(name) != tuple(shape):
            raise WeightLoadError(
                f"tensor {name!r} in {str(self.folder)!r} has shape {list(self.shape(name))}, "
                f"expected {list(shape)} from config.json"
            )
        tensor = self._from_shard(name, torch.device(device)) if WHOLE_SHARDS else None
        if tensor is None:
            try:
                tensor = self._handle(name).get_tensor(name)
            except Exception as exc:
                raise WeightLoadError(f"cannot read tensor {name!r}: {exc}") from exc
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor.to(device=device, dtype=dtype or tensor.dtype)

    def get_part(self, name: str, *, shape: tuple[int, ...], dim: int, part: range,
                 dtype: torch.dtype | None = None,
                 device: torch.device | str = "cpu") -> torch.Tensor:
        """Rows (`dim` 0) or columns (`dim` 1) `part` of tensor `name`, whose full shape is
        checked against `shape`: only those bytes are read from the memory map (a tensor-
        parallel rank's shard). Whole-shard reads do not apply."""
        self._check_part(name, shape, dim, part)
        try:
            view = self._handle(name).get_slice(name)
            index = (slice(part.start, part.stop),) if dim == 0 else (
                slice(None), slice(part.start, part.stop))
            tensor = view[index]
        except Exception as exc:
            raise WeightLoadError(f"cannot read part of tensor {name!r}: {exc}") from exc
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor.to(device=device, dtype=dtype or tensor.dtype)

    def _check_part(self, name: str, shape: tuple[int, ...], dim: int, part: range) -> None:
        if self.shape(name) != tuple(shape):
            raise WeightLoadError(
                f"tensor {name!r} in {str(self.folder)!r} has shape {list(self.shape(name))}, "
                f"expected {list(shape)} from config.json"
            )
        if dim not in (0, 1) or dim >= len(shape) or not 0 <= part.start <= part.stop <= shape[dim]:
            raise ValueError(f"part {part} of dim {dim} is not within {name!r} {list(shape)}")

    def _from_shard(self, name: str, device: torch.device) -> torch.Tensor | None:
        """Tensor `name` from its shard, read whole onto `device` the first time one of its
        tensors is asked for. Each is handed out once, so its memory goes with it; asked for
        again, it is None (read it from the memory map)."""
        file_name = self._shard_of[name]
        if file_name not in self._shards_read:
            self._shards_read.add(file_name)
            self._read.update(read_shard(self.folder / file_name, device))
        return self._read.pop(name, None)

    def close(self) -> None:
        self._handles.clear()
        self._read.clear()


def get_part(ckpt: Checkpoint | RandomCheckpoint, name: str, *, shape: tuple[int, ...],
             dim: int, part: range, dtype: torch.dtype | None = None,
             device: torch.device | str = "cpu") -> torch.Tensor:
    """`Checkpoint.get_part` for either kind of checkpoint: a dummy one makes the whole
    tensor (its values depend on the name only, so every rank's part matches one model) and
    keeps the part."""
    if isinstance(ckpt, Checkpoint):
        return ckpt.get_part(name, shape=shape, dim=dim, part=part, dtype=dtype, device=device)
    whole = ckpt.get(name, shape=shape, dtype=dtype, device=device)
    return whole.narrow(dim, part.start, len(part)).clone()


def open_checkpoint(model_dir: str | Path, load_format: str = "safetensors", *,
                    std: float = 0.02) -> Checkpoint | RandomCheckpoint:
    """The checkpoint a model line reads from: the safetensors files, or for `dummy` random
    tensors made on the device (`std` is the config's initializer_range)."""
    if load_format == "dummy":
        return RandomCheckpoint(model_dir, std=std)
    return Checkpoint(model_dir)
