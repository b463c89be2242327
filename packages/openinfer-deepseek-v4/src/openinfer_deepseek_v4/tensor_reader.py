"""Reading DeepSeek-V4 tensors in DeepSeek's names and formats, whole or a tensor-parallel
rank's slice (`Cut`): plain tensors cast to the model's dtype (or fp32 where the spec keeps
it), FP8 (e4m3, one E8M0 scale per 128 x 128 block) and FP4 (e2m1 two per byte, one E8M0 scale
per 32 inputs) dequantized, or kept in their formats for the GPU kernels.

A slice is read with only its bytes (and its scales') when the source can (`part`, as a
checkpoint can) and the slice starts and ends on the scale blocks (always at V4-Flash's shapes);
otherwise the whole tensor is read and dequantized and the slice kept (tiny test models)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from openinfer_core.errors import WeightLoadError
from openinfer_deepseek_v4.quantized import Fp8Linear, Weight
from openinfer_kernels.quant import dequant_fp4_ref, dequant_fp8_blocks_ref

FP8_BLOCK = 128
FP4_GROUP = 32
_FP4_DTYPES = (torch.int8, torch.uint8)


@dataclass(frozen=True, slots=True)
class Cut:
    """Rows (`dim` 0) or columns (`dim` 1) `part` of a tensor, at its dequantized shape."""

    dim: int
    part: range


@runtime_checkable
class ReadsParts(Protocol):
    """A tensor source that reads a slice with only its bytes (a checkpoint can)."""

    def part(self, name: str, dim: int, part: range) -> torch.Tensor:
        """Rows (`dim` 0) or columns (`dim` 1) `part` of tensor `name`, as stored."""
        ...


@runtime_checkable
class ReadsShapes(Protocol):
    """A tensor source that knows a tensor's stored shape without reading it."""

    def shape(self, name: str) -> tuple[int, ...]: ...


def stored_part(state: Mapping[str, torch.Tensor], name: str, dim: int,
                part: range) -> torch.Tensor:
    """`part` of `state[name]` along `dim`, as stored: only those bytes when `state`
    `ReadsParts`."""
    if isinstance(state, ReadsParts):
        return state.part(name, dim, part)
    # A copy: a view would keep the whole tensor's memory.
    return state[name].narrow(dim, part.start, len(part)).clone(
        memory_format=torch.contiguous_format)


def stored_shape(state: Mapping[str, torch.Tensor], name: str) -> tuple[int, ...]:
    """`state[name]`'s shape as stored, without reading it when `state` `ReadsShapes`."""
    if isinstance(state, ReadsShapes):
        return tuple(state.shape(name))
    return tuple(state[name].shape)


def check_shape(name: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    if got != want:
        raise WeightLoadError(f"tensor {name!r} has shape {list(got)}, expected {list(want)} "
                              "from config.json")


def _cut_shape(shape: tuple[int, ...], cut: Cut | None) -> tuple[int, ...]:
    if cut is None:
        return shape
    return tuple(len(cut.part) if d == cut.dim else n for d, n in enumerate(shape))


class TensorReader:
    """Tensors of `state` (DeepSeek's names) whose dequantized shapes are `shapes`."""

    def __init__(self, state: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]],
                 dtype: torch.dtype, keep_quantized: bool,
                 keeps_fp32: Callable[[str], bool]) -> None:
        self.state, self.shapes, self.dtype = state, shapes, dtype
        self.keep_quantized, self._fp32 = keep_quantized, keeps_fp32

    def raw(self, name: str, cut: Cut | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(weight, its scale or None) as stored, cut; None when `cut` splits a scale block."""
        if name not in self.state:
            raise WeightLoadError(f"the checkpoint has no tensor {name!r}")
        scale_name = name.removesuffix(".weight") + ".scale"
        scaled = name.endswith(".weight") and scale_name in self.state
        full = self.shapes[name]
        if cut is None or len(cut.part) == full[cut.dim]:
            return self.state[name], self.state[scale_name] if scaled else None
        if not scaled:
            return stored_part(self.state, name, cut.dim, cut.part), None
        stored = stored_shape(self.state, name)
        fp4 = stored != full and len(full) == 2 and stored == (full[0], full[1] // 2)
        block = (1, FP4_GROUP) if fp4 else (FP8_BLOCK, FP8_BLOCK)
        size, part = block[cut.dim], cut.part
        if part.start % size or (part.stop % size and part.stop != full[cut.dim]):
            return None
        packed = range(part.start // 2, part.stop // 2) if fp4 and cut.dim == 1 else part
        return (stored_part(self.state, name, cut.dim, packed),
                stored_part(self.state, scale_name, cut.dim,
                            range(part.start // size, -(-part.stop // size))))

    def get(self, name: str, cut: Cut | None = None) -> torch.Tensor:
        """Tensor `name` (or its `cut`) in the model's dtype, dequantized."""
        return self._dequant(name, self.raw(name, cut), cut)

    def _dequant(self, name: str, pair: tuple[torch.Tensor, torch.Tensor | None] | None,
                 cut: Cut | None) -> torch.Tensor:
        if pair is None:  # the cut splits a scale block: the whole, dequantized, then cut
            assert cut is not None
            whole = self.get(name)
            return whole.narrow(cut.dim, cut.part.start, len(cut.part)).clone(
                memory_format=torch.contiguous_format)
        t, scale = pair
        if scale is not None and t.dtype == torch.float8_e4m3fn:
            t = dequant_fp8_blocks_ref(t, scale, dtype=self.dtype)
        elif scale is not None and t.dtype in _FP4_DTYPES:
            t = dequant_fp4_ref(t, scale, dtype=self.dtype)
        elif t.is_floating_point():
            t = t.to(torch.float32 if self._fp32(name) else self.dtype)
        check_shape(name, tuple(t.shape), _cut_shape(self.shapes[name], cut))
        return t

    def weight(self, *names: str, cut: Cut | None = None) -> Weight:
        """A linear's weight (rows of several stacked, each cut alike), FP8 kept as it is
        where asked and the row blocks allow it."""
        parts = [self.raw(n, cut) for n in names]
        pairs = [p for p in parts if p is not None]
        fp8 = len(pairs) == len(parts) and all(
            s is not None and t.dtype == torch.float8_e4m3fn for t, s in pairs)
        if not (self.keep_quantized and fp8
                and all(t.shape[0] % FP8_BLOCK == 0 for t, _ in pairs[:-1])):
            got = [self._dequant(n, p, cut) for n, p in zip(names, parts, strict=True)]
            return torch.cat(got) if len(got) > 1 else got[0]
        for n, (t, s) in zip(names, pairs, strict=True):
            want = _cut_shape(self.shapes[n], cut)
            check_shape(n, tuple(t.shape), want)
            assert s is not None
            check_shape(n.removesuffix(".weight") + ".scale", tuple(s.shape),
                        tuple(-(-d // FP8_BLOCK) for d in want))
        return Fp8Linear(torch.cat([t for t, _ in pairs]),
                         torch.cat([s.view(torch.uint8) for _, s in pairs if s is not None]))

    def fp4(self, name: str, cut: Cut | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """An FP4 weight's packed codes and scales (as bytes), shapes checked; None when it is
        not FP4 (or `cut` splits its scale groups)."""
        pair = self.raw(name, cut)
        if pair is None:
            return None
        packed, scale = pair
        if scale is None or packed.dtype not in _FP4_DTYPES:
            return None
        rows, cols = _cut_shape(self.shapes[name], cut)
        check_shape(name, tuple(packed.shape), (rows, cols // 2))
        check_shape(name.removesuffix(".weight") + ".scale", tuple(scale.shape),
                    (rows, cols // FP4_GROUP))
        return packed.view(torch.uint8), scale.view(torch.uint8)
