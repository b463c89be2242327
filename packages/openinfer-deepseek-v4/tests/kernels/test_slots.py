"""A step's slot arithmetic (kernels/slots): the Triton kernels give the torch references'
values and dtypes, on steps with several requests of different lengths, an empty request,
CUDA-graph padding tokens past every request (full-group slot in block 0), windows that start
before position 0, and compressed entries past a request's table (clamped to its last
column)."""

from __future__ import annotations

import pytest
import torch

from openinfer_deepseek_v4.kernels.slots import (
    closed_entry_slots_ref,
    token_requests_ref,
    token_slots_ref,
    visible_entry_slots_ref,
    window_slots_ref,
)
from openinfer_deepseek_v4.kernels.slots.triton import (
    closed_entry_slots_triton,
    token_requests_triton,
    token_slots_triton,
    visible_entry_slots_triton,
    window_slots_triton,
)

# The kernels run compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = 16


def step(lens: list[int], starts: list[int], padding: int, seed: int
         ) -> tuple[torch.Tensor, ...]:
    """A step of requests with `lens` new tokens after `starts` cached ones, then `padding`
    tokens past them (position 0, full-group slot 0): (query_start_loc int32, positions int64,
    slot_mapping int64, a block table [B, max_blocks] int32 of distinct random blocks)."""
    g = torch.Generator().manual_seed(seed)
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens, strict=True)]
                          + [torch.zeros(padding, dtype=torch.int64)])
    width = max(-(-(s + n) // BLOCK) for s, n in zip(starts, lens, strict=True)) + 1
    table = (1 + torch.randperm(len(lens) * width, generator=g)).view(len(lens), width)
    requests = token_requests_ref(qsl, len(positions)).long()
    real = torch.arange(len(positions)) < int(qsl[-1])
    slots = table[requests, positions // BLOCK] * BLOCK + positions % BLOCK
    slot_mapping = torch.where(real, slots, 0)
    return (qsl.to(DEVICE), positions.to(DEVICE), slot_mapping.to(DEVICE),
            table.to(torch.int32).to(DEVICE))


STEPS = {
    "decode": ([1, 1, 1], [0, 37, 300], 0),
    "mixed": ([5, 0, 70, 1], [3, 9, 130, 511], 0),
    "padded": ([2, 40], [250, 0], 22),
    "one": ([1], [4099], 0),
}


@pytest.mark.parametrize("case", list(STEPS))
def test_the_slot_kernels_give_the_references_values(case: str) -> None:
    qsl, positions, slot_mapping, table = step(*STEPS[case], seed=len(case))
    # Every kernel launches before anything is compared (the TTIR sweep runs this test with
    # no kernel running), each from the reference's requests.
    t = positions.shape[0]
    requests = token_requests_ref(qsl, t)
    pairs = [
        (token_requests_triton(qsl, t), requests),
        (token_slots_triton(table, requests, positions, slot_mapping, BLOCK),
         token_slots_ref(table, requests, positions, slot_mapping, BLOCK)),
        (window_slots_triton(table, requests, positions, 128, BLOCK),
         window_slots_ref(table, requests, positions, 128, BLOCK)),
        (window_slots_triton(table, requests, positions, 7, BLOCK),
         window_slots_ref(table, requests, positions, 7, BLOCK)),
    ]
    for ratio, spb in ((4, BLOCK // 4), (128, 1)):
        entries = dict(ratio=ratio, block_size=BLOCK, slots_per_block=spb)
        for width in (1, 300, 4096 // ratio):
            pairs.append((visible_entry_slots_triton(table, requests, positions, width,
                                                     **entries),
                          visible_entry_slots_ref(table, requests, positions, width,
                                                  **entries)))
        pairs.append((closed_entry_slots_triton(table, requests, positions, **entries),
                      closed_entry_slots_ref(table, requests, positions, **entries)))
    for got, want in pairs:
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)


def test_no_tokens_and_no_requests() -> None:
    qsl = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    assert token_requests_triton(qsl, 0).shape == (0,)
    assert torch.equal(token_requests_triton(qsl, 3), token_requests_ref(qsl, 3))
    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    table = torch.zeros(1, 2, dtype=torch.int32, device=DEVICE)
    assert window_slots_triton(table, empty, empty, 8, BLOCK).shape == (0, 8)
    assert visible_entry_slots_triton(table, empty, empty, 5, ratio=4, block_size=BLOCK,
                                      slots_per_block=4).shape == (0, 5)
