"""kv_append against a token-by-token Python loop over (block, offset): it copies values, so
equality is exact, and every slot not named in slot_mapping must stay as it was."""

from __future__ import annotations

import pytest
import torch

import openinfer_kernels
from openinfer_kernels.kv_store import kv_append_ref
from openinfer_kernels.kv_store.triton import kv_append_triton

# The kernel runs compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

NUM_BLOCKS, BLOCK_SIZE = 20, 4

SLOTS = {
    "t1-decode": [22],  # block 5, offset 2
    "padding-row": [17, 0],  # a padded row writes to the padding block's slot 0
    "one-request-shuffled-blocks": [36, 37, 38, 39, 12, 13, 14, 28, 29],  # blocks 9, 3, 7
    # 63 distinct slots in random order, leaving 17 of the 80 unwritten, some in written blocks.
    "t63-scattered": torch.randperm(NUM_BLOCKS * BLOCK_SIZE,
                                    generator=torch.Generator().manual_seed(0))[:63].tolist(),
    "negative-skips": [-1, 9, -1, -1, 70],  # padded rows that must write nothing
}


def caches(hk: int, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (NUM_BLOCKS, BLOCK_SIZE, hk, d)
    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


def expected_cache(values: torch.Tensor, slots: list[int], hk: int, d: int,
                   dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, hk, d, dtype=dtype)
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        block, offset = divmod(slot, BLOCK_SIZE)
        out[block, offset] = values[t].to(dtype)
    return out


def kv(t: int, hk: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, hk, d, generator=g), torch.randn(t, hk, d, generator=g)


def test_slot_cases_are_distinct():
    # Two tokens writing one slot would make the expected cache order-dependent.
    for slots in SLOTS.values():
        written = [s for s in slots if s >= 0]
        assert len(set(written)) == len(written)


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
    written_blocks = {s // BLOCK_SIZE for s in slots if s >= 0}
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


# Kernel vs reference: both copy values, so caches must match bit for bit, including the slots
# no token names (the caches start random here, so a stray write shows). The one exception is an
# fp32 step into a bf16 cache under the Triton interpreter, whose fp32 -> bf16 cast truncates where
# the GPU (and torch) round to nearest even: one bf16 ulp (2^-7 relative) apart at most.
CACHE_CASES = {  # (Hk, D, step dtype, cache dtype)
    "hk1-d60-bf16": (1, 60, torch.bfloat16, torch.bfloat16),
    "hk2-d24-fp32": (2, 24, torch.float32, torch.float32),
    "hk8-d128-bf16": (8, 128, torch.bfloat16, torch.bfloat16),
    "hk2-d24-fp32-into-bf16": (2, 24, torch.float32, torch.bfloat16),
}


def assert_same_cache(got: torch.Tensor, want: torch.Tensor, step_dtype: torch.dtype) -> None:
    if got.is_cuda or step_dtype == got.dtype:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=2**-7, atol=0)


def check_triton(slots: list[int], hk: int, d: int, step_dtype: torch.dtype,
                 cache_dtype: torch.dtype, num_blocks: int = NUM_BLOCKS) -> None:
    g = torch.Generator().manual_seed(len(slots))
    t = len(slots)
    # k and v as the model hands them over: column slices of one fused qkv projection output.
    qkv = torch.randn(t, 4 * hk * d, generator=g).to(step_dtype).to(DEVICE)
    k = qkv[:, 2 * hk * d : 3 * hk * d].view(t, hk, d)
    v = qkv[:, 3 * hk * d :].view(t, hk, d)
    shape = (num_blocks, BLOCK_SIZE, hk, d)
    k_cache = torch.randn(shape, generator=g).to(cache_dtype).to(DEVICE)
    v_cache = torch.randn(shape, generator=g).to(cache_dtype).to(DEVICE)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=DEVICE)

    assert kv_append_triton(k, v, k_cache, v_cache, slot_mapping) is None
    kv_append_ref(k, v, want_k, want_v, slot_mapping)

    assert_same_cache(k_cache, want_k, step_dtype)
    assert_same_cache(v_cache, want_v, step_dtype)


@pytest.mark.parametrize("cache_case", list(CACHE_CASES))
@pytest.mark.parametrize("case", list(SLOTS))
def test_triton_matches_reference(case, cache_case):
    check_triton(SLOTS[case], *CACHE_CASES[cache_case])


def test_triton_empty_step_writes_nothing():
    check_triton([], 2, 24, torch.float32, torch.float32)


def test_triton_rejects_a_cache_of_another_shape():
    k = torch.zeros(1, 2, 24)
    with pytest.raises(ValueError, match="do not fit"):
        kv_append_triton(k, k, *caches(2, 60, torch.float32), torch.tensor([0]))


@pytest.mark.gpu
@pytest.mark.parametrize("step_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_triton_full_size(step_dtype):
    # A 4096-token prefill into 8 KV heads of 128, every 7th slot of a large cache, some padded.
    num_blocks = 4096 * 7 // BLOCK_SIZE + 1
    slots = [7 * t if t % 100 else -1 for t in range(4096)]
    check_triton(slots, 8, 128, step_dtype, torch.bfloat16, num_blocks=num_blocks)
