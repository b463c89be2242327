"""`--load-format dummy`: a checkpoint that has every tensor a model line asks for, made up on
the device at the asked shape — for benchmarks and smoke tests of real shapes without weights.

Values follow transformers' initialisation closely enough for the numbers to stay finite:
matrices ~ N(0, initializer_range), norm weights 1, other vectors (biases) 0. Each tensor's
values depend only on its name, so two loads of the same config build the same model."""

from __future__ import annotations

import zlib
from pathlib import Path

import torch


class RandomCheckpoint:
    """The `Checkpoint` surface (`get`, `names`, `__contains__`, `close`) without files."""

    def __init__(self, model_dir: str | Path, *, std: float = 0.02, seed: int = 0) -> None:
        self.folder = Path(model_dir)
        self.std = std
        self.seed = seed

    def names(self) -> set[str]:
        return set()  # any name is available: the model line decides what it needs

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)

    def get(self, name: str, *, shape: tuple[int, ...] | None = None,
            dtype: torch.dtype | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
        if shape is None:
            raise ValueError(f"a dummy checkpoint needs the shape of {name!r}")
        dtype = dtype or torch.bfloat16
        if len(shape) == 1:
            fill = 1.0 if "norm" in name else 0.0
            return torch.full(shape, fill, dtype=dtype, device=device)
        gen = torch.Generator(device=device)
        gen.manual_seed(zlib.crc32(name.encode()) ^ self.seed)
        out = torch.empty(shape, dtype=dtype, device=device)
        return out.normal_(0.0, self.std, generator=gen)

    def close(self) -> None:
        pass
