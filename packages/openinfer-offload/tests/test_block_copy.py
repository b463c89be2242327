"""Block gathers and scatters between paged KV tensors and block-major rows: the reference
against a per-block loop, and the Triton kernel (compiled on a GPU, interpreted on CPU) against
the reference. Copies, so equality is exact."""

from __future__ import annotations

import pytest
import torch

from openinfer_offload.block_copy import reference
from openinfer_offload.block_copy import triton as kernels

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def paged(num_tensors: int, num_blocks: int, shape: tuple[int, ...], dtype: torch.dtype,
          seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn((num_blocks, *shape), generator=g).to(dtype).to(DEVICE)
            for _ in range(num_tensors)]


def rows_by_loop(tensors: list[torch.Tensor], ids: list[int]) -> torch.Tensor:
    return torch.stack([torch.cat([t[b].reshape(-1).view(torch.uint8) for t in tensors])
                        for b in ids])


CASES = {  # tensors, blocks, per-block shape, dtype
    "qwen-like-bf16": (4, 9, (4, 2, 8), torch.bfloat16),
    "odd-fp32": (3, 7, (3, 5, 3), torch.float32),  # 180 bytes a block: not a power of two
    "one-tensor": (1, 5, (2, 2, 2), torch.float16),
    "fp8-kv": (4, 9, (4, 2, 8), torch.float8_e4m3fn),  # --kv-cache-dtype fp8: half the bytes
}


@pytest.mark.parametrize("case", CASES)
def test_reference_gather_matches_a_loop_and_scatter_inverts_it(case: str) -> None:
    n, blocks, shape, dtype = CASES[case]
    tensors = paged(n, blocks, shape, dtype, seed=1)
    ids = [5, 1, 6, 2] if blocks > 6 else [4, 1]
    rows = torch.empty((len(ids) + 2, sum(t[0].nbytes for t in tensors)), dtype=torch.uint8,
                       device=DEVICE)  # spare rows: only the first len(ids) are written
    reference.gather_blocks_ref(tensors, torch.tensor(ids, device=DEVICE), rows)
    assert torch.equal(rows[:len(ids)], rows_by_loop(tensors, ids))
    target = paged(n, blocks, shape, dtype, seed=2)
    before = [t.clone() for t in target]
    dest = [3, 0, 4, 6][:len(ids)]
    reference.scatter_blocks_ref(rows, torch.tensor(dest, device=DEVICE), target)
    for t, src, old in zip(target, tensors, before, strict=True):
        for d, s in zip(dest, ids, strict=True):
            assert torch.equal(t[d], src[s])
        untouched = [b for b in range(blocks) if b not in dest]
        assert torch.equal(t[untouched], old[untouched])


@pytest.mark.parametrize("case", [c for c in CASES if kernels.supports(
    paged(*CASES[c][:3], CASES[c][3], seed=0))])
def test_kernel_matches_reference(case: str) -> None:
    n, blocks, shape, dtype = CASES[case]
    tensors = paged(n, blocks, shape, dtype, seed=3)
    ids = torch.tensor([2, 0, 4, 3], device=DEVICE)
    width = sum(t[0].nbytes for t in tensors)
    ours = torch.zeros((4, width), dtype=torch.uint8, device=DEVICE)
    ref = torch.zeros_like(ours)
    kernels.Kernels(tensors).gather(ids, ours)
    reference.gather_blocks_ref(tensors, ids, ref)
    assert torch.equal(ours, ref)
    a, b = paged(n, blocks, shape, dtype, seed=4), paged(n, blocks, shape, dtype, seed=4)
    kernels.Kernels(a).scatter(ours, ids)
    reference.scatter_blocks_ref(ref, ids, b)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_kernel_declines_mixed_block_sizes() -> None:
    tensors = [torch.zeros(3, 4), torch.zeros(3, 8)]
    assert not kernels.supports(tensors)
    assert kernels.supports([torch.zeros(3, 4), torch.zeros(3, 4)])
    assert not kernels.supports([torch.zeros(3, 3, dtype=torch.float16)] * 2)  # 6 bytes
