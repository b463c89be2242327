"""Tensors of a checkpoint in HF's FP8 layout (`quantization.BlockFp8`), whole or a tensor-
parallel rank's rows or columns: a quantized linear's e4m3 values and the scales of the
blocks they touch, as stored (a model line dequantizes them, or keeps them for FP8 kernels);
every other tensor plain, in the model's dtype. Per-channel (or per-tensor) scaled FP8
(`quantization.ChannelFp8`) is dequantized here, to the model's dtype: the FP8 kernels read
128 x 128 block scales only. A dummy checkpoint (`--load-format dummy`)
makes FP8 linears up where config.json declares FP8: random e4m3 values with float32 block
scales at the real shapes, so benchmarks read what a real FP8 checkpoint gives.

Nothing FP8 is ever cast as if it were a plain tensor: an FP8 tensor without its block scales,
block scales where config.json declares no quantization, or scales beside a weight that is not
e4m3 are refused with the tensor named, since the cast would load a model that runs and
answers wrongly."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from openinfer_core.errors import WeightLoadError
from openinfer_core.weights.checkpoint import Checkpoint, RandomCheckpoint, get_part
from openinfer_core.weights.quantization import (
    BlockFp8,
    ChannelFp8,
    Fp8Scheme,
    channel_scale_name,
    scale_name,
)

FP8_DTYPES = frozenset({torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2,
                        torch.float8_e5m2fnuz})
# Float multipliers (HF's fp32 `weight_scale_inv`; bf16 in some exports), or E8M0 powers of two.
SCALE_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16, torch.float8_e8m0fnu})


@dataclass(frozen=True, slots=True)
class Fp8BlockWeight:
    """A linear's block-scaled FP8 weight as stored: e4m3 `weight` [O, I] (or rows / columns of
    it) and `scale`, one per `block` of it. A part that starts inside a scale block is read
    from that block's start, so every block is whole at the front: the first `skip` rows
    (`dim` 0) or columns (`dim` 1) of the dequantized weight precede the part."""

    weight: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]
    dim: int = 0
    skip: int = 0


def read_linear(ckpt: Checkpoint | RandomCheckpoint, name: str, *, shape: tuple[int, int],
                quant: Fp8Scheme | None, dtype: torch.dtype, device: torch.device,
                dim: int = 0, part: range | None = None) -> torch.Tensor | Fp8BlockWeight:
    """Linear weight `name` of full `shape` [O, I], or its `part` along `dim`: FP8 as stored
    where the checkpoint holds its block scales (`quant` must declare them), else a plain
    tensor in `dtype`. A dummy checkpoint's weights are FP8 where `quant` declares block-
    scaled FP8. Per-channel FP8 (`ChannelFp8`) is dequantized to `dtype` here."""
    if isinstance(quant, ChannelFp8):
        return _read_channel(ckpt, name, shape=shape, dtype=dtype, device=device, dim=dim,
                             part=part)
    if isinstance(ckpt, RandomCheckpoint) and quant is not None:
        return _random_fp8(ckpt, name, shape=shape, quant=quant, device=device, dim=dim,
                           part=part)
    scales = scale_name(name)
    if isinstance(ckpt, RandomCheckpoint) or scales not in ckpt:
        return read_unquantized(ckpt, name, shape=shape, dtype=dtype, device=device, dim=dim,
                                part=part)
    if quant is None:
        raise WeightLoadError(
            f"checkpoint {str(ckpt.folder)!r} has FP8 block scales ({scales!r}) but its "
            "config.json declares no quantization_config: restore the quantization_config the "
            "checkpoint was saved with, or load a checkpoint without quantized weights")
    size = quant.block[dim]
    part = range(shape[dim]) if part is None else part
    start = part.start // size * size
    weight = _read(ckpt, name, shape, dim, range(start, part.stop), device)
    if weight.dtype != torch.float8_e4m3fn:
        raise WeightLoadError(
            f"tensor {name!r} is stored as {weight.dtype} beside block scales {scales!r}; "
            "quantization_config fp8 (fmt e4m3) stores quantized weights as float8_e4m3fn")
    grid = (-(-shape[0] // quant.block[0]), -(-shape[1] // quant.block[1]))
    scale = _read(ckpt, scales, grid, dim, range(start // size, -(-part.stop // size)), device)
    if scale.dtype not in SCALE_DTYPES:
        raise WeightLoadError(
            f"tensor {scales!r} is stored as {scale.dtype}; block scales are float32, "
            "bfloat16, float16 or float8_e8m0fnu")
    return Fp8BlockWeight(weight, scale, quant.block, dim, part.start - start)


def _read_channel(ckpt: Checkpoint | RandomCheckpoint, name: str, *, shape: tuple[int, int],
                  dtype: torch.dtype, device: torch.device, dim: int,
                  part: range | None) -> torch.Tensor:
    """`read_linear` of a per-channel FP8 checkpoint: the weight (its part) dequantized to
    `dtype` with its row scales; a weight without `weight_scale` is read as a plain one."""
    scales = channel_scale_name(name)
    if isinstance(ckpt, RandomCheckpoint) or scales not in ckpt:
        return read_unquantized(ckpt, name, shape=shape, dtype=dtype, device=device, dim=dim,
                                part=part)
    rows = range(shape[0]) if part is None or dim == 1 else part
    weight = _read(ckpt, name, shape, dim, range(shape[dim]) if part is None else part, device)
    if weight.dtype != torch.float8_e4m3fn:
        raise WeightLoadError(
            f"tensor {name!r} is stored as {weight.dtype} beside scales {scales!r}; FP8 "
            "checkpoints store quantized weights as float8_e4m3fn")
    scale = ckpt.get(scales, device=device)
    if scale.dtype not in SCALE_DTYPES - {torch.float8_e8m0fnu} or scale.numel() not in (
            1, shape[0]) or (scale.dim() == 2 and scale.shape[1] != 1) or scale.dim() > 2:
        raise WeightLoadError(
            f"tensor {scales!r} has shape {list(scale.shape)} and dtype {scale.dtype}; "
            f"per-channel scales are float [{shape[0]}, 1] or [{shape[0]}], per-tensor "
            "ones [1] or []")
    scale = scale.float().reshape(-1, 1)
    if scale.shape[0] > 1:
        scale = scale[rows.start:rows.stop]
    return (weight.float() * scale).to(dtype)  # in fp32, rounded once


def _random_fp8(ckpt: RandomCheckpoint, name: str, *, shape: tuple[int, int], quant: BlockFp8,
                device: torch.device, dim: int, part: range | None) -> Fp8BlockWeight:
    """`read_linear` of a dummy checkpoint: the random weight (~ N(0, std), its values
    depending on the name only, so every rank's part is of one model) as e4m3 codes of
    N(0, std / 2^e) times one float32 scale 2^e (2^e <= std: the codes sit in e4m3's normal
    range); a part is cut as a stored one is read, from its first block's start."""
    exponent = math.floor(math.log2(ckpt.std)) if ckpt.std > 0 else 0
    values = ckpt.get(name, shape=shape, dtype=torch.float32, device=device)
    weight = (values * 2.0 ** -exponent).to(torch.float8_e4m3fn)
    del values
    grid = (-(-shape[0] // quant.block[0]), -(-shape[1] // quant.block[1]))
    scale = torch.full(grid, 2.0 ** exponent, dtype=torch.float32, device=device)
    size = quant.block[dim]
    part = range(shape[dim]) if part is None else part
    start = part.start // size * size
    if len(part) != shape[dim]:
        weight = weight.narrow(dim, start, part.stop - start).contiguous()
        first = start // size
        scale = scale.narrow(dim, first, -(-part.stop // size) - first).contiguous()
    return Fp8BlockWeight(weight, scale, quant.block, dim, part.start - start)


def read_unquantized(ckpt: Checkpoint | RandomCheckpoint, name: str, *,
                     shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                     dim: int = 0, part: range | None = None) -> torch.Tensor:
    """Tensor `name` of full `shape` (or its `part` along `dim`) in `dtype`; an FP8 one is
    refused (without its block scales it cannot be read)."""
    if isinstance(ckpt, RandomCheckpoint):
        if part is None or len(part) == shape[dim]:
            return ckpt.get(name, shape=shape, dtype=dtype, device=device)
        return get_part(ckpt, name, shape=shape, dim=dim, part=part, dtype=dtype, device=device)
    tensor = _read(ckpt, name, shape, dim, range(shape[dim]) if part is None else part, device)
    if tensor.dtype in FP8_DTYPES:
        raise WeightLoadError(
            f"tensor {name!r} in {str(ckpt.folder)!r} is stored as {tensor.dtype} without "
            f"block scales ({scale_name(name)!r} is missing): FP8 weights load only as "
            "block-scaled linears that config.json's quantization_config declares")
    return tensor.to(dtype)


def _read(ckpt: Checkpoint, name: str, shape: tuple[int, ...], dim: int, part: range,
          device: torch.device) -> torch.Tensor:
    """`part` of tensor `name` along `dim`, as stored (only its bytes when it is not whole)."""
    if len(part) == shape[dim]:
        return ckpt.get(name, shape=shape, device=device)
    return ckpt.get_part(name, shape=shape, dim=dim, part=part, device=device)
