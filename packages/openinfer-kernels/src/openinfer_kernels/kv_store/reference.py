"""Writing a step's keys and values into the paged cache."""

from __future__ import annotations

import torch


def kv_append_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store token t's k/v ([T, Hk, D]) at flat slot `slot_mapping[t]` of the caches
    ([num_blocks, block_size, Hk, D]); slot = block_id * block_size + offset. A negative slot
    skips its token (a padded row that must write nothing). Mutates the caches."""
    num_blocks, block_size, heads, dim = k_cache.shape
    keep = slot_mapping >= 0  # on CUDA this mask syncs with the host; the Triton kernel does not
    slots = slot_mapping[keep]
    k_cache.view(num_blocks * block_size, heads, dim).index_copy_(
        0, slots, k[keep].to(k_cache.dtype))
    v_cache.view(num_blocks * block_size, heads, dim).index_copy_(
        0, slots, v[keep].to(v_cache.dtype))
