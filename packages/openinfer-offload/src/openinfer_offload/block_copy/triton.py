# mypy: disable-error-code="no-untyped-def"
"""Block copies in one launch: a table of the tensors' base addresses, one program per (block,
tensor), 4-byte words. (The mypy line above: @triton.jit functions annotate only their
constexpr parameters.)"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

_WORD = 4
_BLOCK = 2048  # words per loop iteration


def supports(tensors: Sequence[torch.Tensor]) -> bool:
    """Every tensor contiguous, with the same whole-word bytes per block."""
    sizes = {t[0].numel() * t.element_size() for t in tensors}
    return (len(sizes) == 1 and next(iter(sizes)) % _WORD == 0
            and all(t.is_contiguous() for t in tensors))


@triton.jit
def _copy_kernel(table_ptr, ids_ptr, rows_ptr, PART_WORDS: tl.constexpr,
                 NUM_PARTS: tl.constexpr, TO_ROWS: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    part = tl.program_id(1)
    block = tl.load(ids_ptr + i).to(tl.int64)
    paged = tl.load(table_ptr + part).to(tl.pointer_type(tl.int32)) + block * PART_WORDS
    row = rows_ptr + (i.to(tl.int64) * NUM_PARTS + part) * PART_WORDS
    for start in range(0, PART_WORDS, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < PART_WORDS
        if TO_ROWS:
            tl.store(row + offs, tl.load(paged + offs, mask=mask), mask=mask)
        else:
            tl.store(paged + offs, tl.load(row + offs, mask=mask), mask=mask)


class Kernels:
    """Gathers and scatters for one list of paged tensors (`supports(tensors)`), the pointer
    table and sizes worked out once: a launch costs one Triton call."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.num_parts = len(tensors)
        self.part_words = tensors[0][0].numel() * tensors[0].element_size() // _WORD
        self.block = min(_BLOCK, triton.next_power_of_2(self.part_words))
        self.table = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64,
                                  device=tensors[0].device)

    def gather(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        """`out[i]` = block `ids[i]` of every tensor, as bytes."""
        self._launch(ids, out, True)

    def scatter(self, src: torch.Tensor, ids: torch.Tensor) -> None:
        """Block `ids[i]` of every tensor = `src[i]`."""
        self._launch(ids, src, False)

    def _launch(self, ids: torch.Tensor, rows: torch.Tensor, to_rows: bool) -> None:
        if ids.numel():
            _copy_kernel[(ids.numel(), self.num_parts)](
                self.table, ids, rows.view(torch.int32), PART_WORDS=self.part_words,
                NUM_PARTS=self.num_parts, TO_ROWS=to_rows, BLOCK=self.block)
