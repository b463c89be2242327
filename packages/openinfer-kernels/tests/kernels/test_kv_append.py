"""kv_append against a token-by-token Python loop over (block, offset): it copies values, so
equality is exact, and every slot not named in slot_mapping must stay as it was."""

from __future__ import annotations

import pytest
import torch

import openinfer_kernels
from openinfer_kernels.kv_store import kv_append_ref

NUM_BLOCKS, BLOCK_SIZE = 20, 4

SLOTS = {
    "t1-decode": [22],  # block 5, offset 2
    "padding-row": [17, 0],  # a padded row writes to the padding block's slot 0
    "one-request-shuffled-blocks": [36, 37, 38, 39, 12, 13, 14, 28, 29],  # blocks 9, 3, 7
    # 63 distinct slots in random order, leaving 17 of the 80 unwritten, some in written blocks.
    "t63-scattered": torch.randperm(NUM_BLOCKS * BLOCK_SIZE,
                                    generator=torch.Generator().manual_seed(0))[:63].tolist(),
}


def caches(hk: int, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (NUM_BLOCKS, BLOCK_SIZE, hk, d)
    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


def expected_cache(values: torch.Tensor, slots: list[int], hk: int, d: int,
                   dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, hk, d, dtype=dtype)
    for t, slot in enumerate(slots):
        block, offset = divmod(slot, BLOCK_SIZE)
        out[block, offset] = values[t].to(dtype)
    return out


def kv(t: int, hk: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, hk, d, generator=g), torch.randn(t, hk, d, generator=g)


def test_slot_cases_are_distinct():
    # Two tokens writing one slot would make the expected cache order-dependent.
    for slots in SLOTS.values():
        assert len(set(slots)) == len(slots)


@pytest.mark.parametrize(("cache_dtype"), [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("hk", "d"), [(1, 60), (2, 24), (3, 128)], ids=["hk1-d60", "hk2-d24",
                                                                        "hk3-d128"])
@pytest.mark.parametrize("case", list(SLOTS))
def test_writes_exactly_the_given_slots(case, hk, d, cache_dtype):
    slots = SLOTS[case]
    k, v = kv(len(slots), hk, d)  # fp32 step values; a bf16 cache stores them rounded
    k_cache, v_cache = caches(hk, d, cache_dtype)

    assert kv_append_ref(k, v, k_cache, v_cache, torch.tensor(slots)) is None

    assert torch.equal(k_cache, expected_cache(k, slots, hk, d, cache_dtype))
    assert torch.equal(v_cache, expected_cache(v, slots, hk, d, cache_dtype))
    written_blocks = {s // BLOCK_SIZE for s in slots}
    for block in set(range(NUM_BLOCKS)) - written_blocks:
        assert not k_cache[block].any() and not v_cache[block].any(), f"block {block} touched"


def test_decode_append_keeps_the_prefill():
    k_cache, v_cache = caches(2, 24, torch.float32)
    prefill_slots, decode_slot = [8, 9, 10, 11, 4], [5]  # blocks 2 then 1
    k, v = kv(6, 2, 24)
    kv_append_ref(k[:5], v[:5], k_cache, v_cache, torch.tensor(prefill_slots))
    kv_append_ref(k[5:], v[5:], k_cache, v_cache, torch.tensor(decode_slot))
    all_slots = prefill_slots + decode_slot
    assert torch.equal(k_cache, expected_cache(k, all_slots, 2, 24, torch.float32))
    assert torch.equal(v_cache, expected_cache(v, all_slots, 2, 24, torch.float32))


def test_out_of_range_slot_raises():
    k_cache, v_cache = caches(1, 8, torch.float32)
    k, v = kv(1, 1, 8)
    with pytest.raises((IndexError, RuntimeError)):
        kv_append_ref(k, v, k_cache, v_cache, torch.tensor([NUM_BLOCKS * BLOCK_SIZE]))


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_public_op_on_cpu_is_the_reference(cache_dtype):
    slots = torch.tensor(SLOTS["t63-scattered"])
    k, v = kv(len(slots), 2, 60, seed=1)
    got, want = caches(2, 60, cache_dtype), caches(2, 60, cache_dtype)
    openinfer_kernels.kv_append(k, v, *got, slots)
    kv_append_ref(k, v, *want, slots)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
