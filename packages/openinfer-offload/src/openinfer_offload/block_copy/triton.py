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


_tables: dict[tuple[int, ...], torch.Tensor] = {}


def _table(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    key = tuple(t.data_ptr() for t in tensors)
    table = _tables.get(key)
    if table is None:
        _tables.clear()  # one KV cache per process: a new one replaces the old
        table = _tables[key] = torch.tensor(key, dtype=torch.int64, device=tensors[0].device)
    return table


def _launch(tensors: Sequence[torch.Tensor], ids: torch.Tensor, rows: torch.Tensor,
            to_rows: bool) -> None:
    n = ids.numel()
    if n == 0:
        return
    part_words = tensors[0][0].numel() * tensors[0].element_size() // _WORD
    _copy_kernel[(n, len(tensors))](
        _table(tensors), ids, rows.view(torch.int32), PART_WORDS=part_words,
        NUM_PARTS=len(tensors), TO_ROWS=to_rows, BLOCK=min(_BLOCK, triton.next_power_of_2(
            part_words)))


@triton.jit
def _host_kernel(table_ptr, ids_ptr, slots_ptr, host_addr, num_items, PART_WORDS: tl.constexpr,
                 NUM_PARTS: tl.constexpr, TO_HOST: tl.constexpr, BLOCK: tl.constexpr,
                 PROGRAMS: tl.constexpr):
    """Straight between the paged tensors and pinned host rows (mapped into the device's
    address space), no staging: item k is part k % NUM_PARTS of block k // NUM_PARTS; program
    p does items p, p + PROGRAMS, ..., so neighbouring programs touch neighbouring host bytes."""
    host = host_addr.to(tl.pointer_type(tl.int32))
    for item in range(tl.program_id(0), num_items, PROGRAMS):
        i = item // NUM_PARTS
        part = item % NUM_PARTS
        block = tl.load(ids_ptr + i).to(tl.int64)
        slot = tl.load(slots_ptr + i).to(tl.int64)
        paged = tl.load(table_ptr + part).to(tl.pointer_type(tl.int32)) + block * PART_WORDS
        row = host + (slot * NUM_PARTS + part) * PART_WORDS
        for start in range(0, PART_WORDS, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < PART_WORDS
            if TO_HOST:
                tl.store(row + offs, tl.load(paged + offs, mask=mask), mask=mask)
            else:
                tl.store(paged + offs, tl.load(row + offs, mask=mask), mask=mask)


def host_copy(tensors: Sequence[torch.Tensor], ids: torch.Tensor, pool: torch.Tensor,
              slots: torch.Tensor, to_host: bool, programs: int) -> None:
    """Blocks `ids` of the paged tensors <-> rows `slots` of the pinned `pool`
    (`[rows, block_bytes]` uint8), by `programs` programs reading or writing host memory
    directly. `ids` and `slots` live on the device."""
    n = ids.numel()
    if n == 0:
        return
    part_words = tensors[0][0].numel() * tensors[0].element_size() // _WORD
    _host_kernel[(programs,)](
        _table(tensors), ids, slots, pool.data_ptr(), n * len(tensors), PART_WORDS=part_words,
        NUM_PARTS=len(tensors), TO_HOST=to_host,
        BLOCK=min(_BLOCK, triton.next_power_of_2(part_words)), PROGRAMS=programs)


def gather_blocks(tensors: Sequence[torch.Tensor], ids: torch.Tensor, out: torch.Tensor) -> None:
    _launch(tensors, ids, out, True)


def scatter_blocks(src: torch.Tensor, ids: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    _launch(tensors, ids, src, False)
