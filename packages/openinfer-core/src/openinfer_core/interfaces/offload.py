"""KV offload tiers below device memory (host DRAM, disk), keyed by prefix-cache block hash."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class LoadHandle(Protocol):
    def poll(self) -> bool:
        """True once the blocks have landed in device memory. Never blocks."""
        ...


@runtime_checkable
class OffloadTier(Protocol):
    """Registered through `openinfer_register_offload_tiers`; chosen with `--kv-offload`."""

    name: str

    def save(self, hashes: Sequence[int], blocks: Sequence[torch.Tensor]) -> None:
        """Copy `blocks` (one tensor per block) out under `hashes`. May return before the copy
        lands; the tier keeps its own reference to the sources until then."""
        ...

    def query(self, hashes: Sequence[int]) -> int:
        """How many of `hashes`, from the first, the tier holds. Pure."""
        ...

    def load(self, hashes: Sequence[int], into: Sequence[torch.Tensor]) -> LoadHandle:
        """Start copying the blocks for `hashes` into `into`; poll the handle for completion."""
        ...
