"""Plain-torch block copies: one index op per tensor."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch


def _parts(tensors: Sequence[torch.Tensor]) -> Iterator[tuple[torch.Tensor, int, int]]:
    """Each tensor with its byte range inside a block-major row."""
    offset = 0
    for t in tensors:
        size = t[0].numel() * t.element_size()
        yield t, offset, offset + size
        offset += size


def gather_blocks_ref(tensors: Sequence[torch.Tensor], ids: torch.Tensor,
                      out: torch.Tensor) -> None:
    n = ids.numel()
    for t, start, end in _parts(tensors):
        out[:n, start:end] = t.index_select(0, ids).reshape(n, -1).view(torch.uint8)


def scatter_blocks_ref(src: torch.Tensor, ids: torch.Tensor,
                       tensors: Sequence[torch.Tensor]) -> None:
    n = ids.numel()
    for t, start, end in _parts(tensors):
        # Bytes into a byte view of the tensor: any dtype (torch has no index_copy_ for e4m3).
        raw = t.view(torch.uint8)
        raw.index_copy_(0, ids, src[:n, start:end].contiguous().view(n, *raw.shape[1:]))
