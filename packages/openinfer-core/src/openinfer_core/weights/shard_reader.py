"""A whole safetensors file read into tensors on a device with large sequential reads: the file
goes through two pinned host buffers in turn, each chunk's bytes copied asynchronously into the
tensors it overlaps while the next chunk is read. No memory map, no page faults one 4 KiB page
at a time, and no pageable host copy of each tensor on its way to the GPU."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import BinaryIO

import torch

from openinfer_core.errors import WeightLoadError

CHUNK_BYTES = 64 << 20

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}


def read_shard(path: Path, device: torch.device,
               chunk_bytes: int = CHUNK_BYTES) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors file `path`, on `device`, in the file's dtypes."""
    cuda = device.type == "cuda"
    with path.open("rb", buffering=0) as f:
        entries, data_start = _header(f, path)
        out = {name: torch.empty(shape, dtype=dtype, device=device)
               for name, (_, _, dtype, shape) in entries.items()}
        spans = sorted((start, end, name) for name, (start, end, _, _) in entries.items()
                       if end > start)
        total = max((end for _, end, _ in spans), default=0)
        buffers = [torch.empty(min(chunk_bytes, max(total, 1)), dtype=torch.uint8,
                               pin_memory=cuda) for _ in range(2)]
        landed: list[torch.cuda.Event | None] = [None, None]
        f.seek(data_start)
        pos, first, k = 0, 0, 0
        while pos < total:
            buf = buffers[k % 2]
            if (event := landed[k % 2]) is not None:
                event.synchronize()  # the copies out of this buffer are done
            n = min(buf.numel(), total - pos)
            _read_exactly(f, buf[:n], path)
            while first < len(spans) and spans[first][1] <= pos:
                first += 1  # tensors wholly before this chunk
            for start, end, name in spans[first:]:
                if start >= pos + n:
                    break
                lo, hi = max(start, pos), min(end, pos + n)
                dest = out[name].view(-1).view(torch.uint8)
                dest[lo - start:hi - start].copy_(buf[lo - pos:hi - pos], non_blocking=cuda)
            if cuda:
                landed[k % 2] = torch.cuda.Event()
                landed[k % 2].record()  # type: ignore[union-attr]
            pos += n
            k += 1
    if cuda:
        torch.cuda.current_stream(device).synchronize()
    return out


def _header(f: BinaryIO, path: Path) -> tuple[dict[str, tuple[int, int, torch.dtype,
                                                              list[int]]], int]:
    """name -> (start, end, dtype, shape), offsets from the start of the data; and where the
    data starts in the file."""
    raw = f.read(8)
    if len(raw) != 8:
        raise WeightLoadError(f"{path} is not a safetensors file (shorter than its header)")
    (length,) = struct.unpack("<Q", raw)
    try:
        header = json.loads(f.read(length))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WeightLoadError(f"{path}: the safetensors header is not JSON: {exc}") from exc
    header.pop("__metadata__", None)
    entries = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise WeightLoadError(f"{path}: tensor {name!r} has dtype {info.get('dtype')!r}, "
                                  f"which openinfer does not read")
        start, end = info["data_offsets"]
        shape = list(info["shape"])
        numel = 1
        for s in shape:
            numel *= s
        if end - start != numel * dtype.itemsize:
            raise WeightLoadError(
                f"{path}: tensor {name!r} spans {end - start} bytes, but its shape {shape} of "
                f"{info['dtype']} needs {numel * dtype.itemsize}")
        entries[name] = (start, end, dtype, shape)
    return entries, 8 + length


def _read_exactly(f: BinaryIO, dest: torch.Tensor, path: Path) -> None:
    view = memoryview(dest.numpy())  # type: ignore[arg-type]
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            raise WeightLoadError(f"{path} is truncated: its header promises more data")
        got += n
