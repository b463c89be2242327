"""A stand-in device KV cache and tier context for the tier tests, and disk stores over it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from openinfer_core.engine.config import EngineConfig
from openinfer_core.interfaces.offload import OffloadContext
from openinfer_offload.disk import DiskStore

NUM_BLOCKS = 12
BLOCK_SHAPE = (4, 2, 8)  # tokens, heads, head dim
NUM_TENSORS = 4  # two layers, K and V


@dataclass
class FakeKV:
    tensors: list[torch.Tensor]

    def block(self, b: int) -> torch.Tensor:
        return torch.cat([t[b].reshape(-1) for t in self.tensors])


def fake_kv(seed: int = 0) -> FakeKV:
    g = torch.Generator().manual_seed(seed)
    return FakeKV([torch.randn((NUM_BLOCKS, *BLOCK_SHAPE), generator=g)
                   for _ in range(NUM_TENSORS)])


def context(kv: FakeKV, *, host_blocks: float = 8, disk_dir: Path | None = None,
            disk_blocks: int = 100, fingerprint: str = "f00d") -> OffloadContext:
    block_bytes = sum(t[0].nbytes for t in kv.tensors)
    config = EngineConfig(
        model="unused", kv_offload_host_gib=host_blocks * block_bytes / (1 << 30),
        kv_offload_disk_dir=str(disk_dir) if disk_dir else None,
        kv_offload_disk_gib=disk_blocks * (block_bytes + 32) / (1 << 30))
    return OffloadContext(kv.tensors, BLOCK_SHAPE[0], fingerprint, config)


def block_bytes() -> int:
    return sum(t[0].nbytes for t in fake_kv().tensors)


def block(seed: int) -> memoryview:
    """One block's bytes, random from `seed`."""
    return memoryview(np.random.default_rng(seed).integers(0, 256, block_bytes(),
                                                           dtype=np.uint8))


def store_at(root: Path, **kw: object) -> DiskStore:
    return DiskStore(context(fake_kv(), disk_dir=root, **kw))  # type: ignore[arg-type]


def read(store: DiskStore, key: int) -> bytes | None:
    out = np.zeros(block_bytes(), dtype=np.uint8)
    return out.tobytes() if store.get(key, memoryview(out)) else None
