"""The KV device memory: per layer, a key and a value tensor of whole blocks."""

from __future__ import annotations

import torch

from openinfer_kvcache.spec import KVCacheSpec


class KVBuffer:
    """`k[layer]`, `v[layer]`: [num_blocks, block_size, num_kv_heads, head_dim]. Block 0 is the
    padding block: padded rows of a batch write there and nothing reads it."""

    def __init__(self, spec: KVCacheSpec, num_blocks: int, device: torch.device | str) -> None:
        if num_blocks < 2:
            raise ValueError(
                f"a KV buffer needs at least 2 blocks (one is padding), got {num_blocks}")
        self.spec = spec
        self.num_blocks = num_blocks
        shape = (num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
        self.k = [torch.zeros(shape, dtype=spec.dtype, device=device)
                  for _ in range(spec.num_layers)]
        self.v = [torch.zeros(shape, dtype=spec.dtype, device=device)
                  for _ in range(spec.num_layers)]

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.spec.bytes_per_block
