"""sparse_sink_attention: the Triton kernel against `sparse_sink_attention_ref` (gather +
`sink_attention_ref`), on small odd shapes with -1 holes, empty rows and forced splits; at
DeepSeek-V4-Flash's shapes on a GPU (-m gpu)."""

from __future__ import annotations

import pytest
import torch

from openinfer_deepseek_v4.kernels.rotary import rms_rotary_ref, rope_frequencies, rope_table
from openinfer_deepseek_v4.kernels.sparse_attention import (
    sparse_sink_attention,
    sparse_sink_attention_ref,
)
from openinfer_deepseek_v4.kernels.sparse_attention.triton import (
    plan,
    sparse_sink_attention_triton,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# fp32: the kernel differs from the reference only in summation order and exp2 vs exp.
# bf16: the kernel rounds the unnormalised probabilities to bf16 before the PV product, the
# reference the normalised ones (each ~2^-9 relative), and the output itself rounds to bf16.
TOLERANCE = {torch.float32: dict(atol=2e-5, rtol=1e-5),
             torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def make_case(tokens: int, heads: int, dim: int, window: int, picked: int, dtype: torch.dtype,
              *, seed: int = 0, holes: float = 0.3, device: str = DEVICE
              ) -> tuple[torch.Tensor, ...]:
    """Random q, pools (37 raw rows, 53 entries), slot lists with about `holes` of them -1,
    and sinks. Slots may repeat, as the gather allows."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, heads, dim, generator=g)
    kv_pool = torch.randn(37, dim, generator=g)
    entry_pool = torch.randn(53, dim, generator=g)
    window_slots = torch.randint(0, 37, (tokens, window), generator=g, dtype=torch.int32)
    picked_slots = torch.randint(0, 53, (tokens, picked), generator=g, dtype=torch.int32)
    for slots in (window_slots, picked_slots):
        slots[torch.rand(slots.shape, generator=g) < holes] = -1
    sinks = torch.randn(heads, generator=g)
    tensors = (q.to(dtype), kv_pool.to(dtype), entry_pool.to(dtype), window_slots,
               picked_slots, sinks)
    return tuple(t.to(device) for t in tensors)


CASES = {
    # tokens, heads, dim, window, picked
    "one decode token": (1, 8, 64, 16, 33),
    "odd dim 40": (5, 3, 40, 7, 9),
    "odd dim 48, 70 picked": (3, 5, 48, 13, 70),
    "window only": (4, 6, 40, 11, 0),
    "picked only": (2, 4, 64, 0, 21),
    "nine tokens": (9, 7, 40, 5, 6),
    # 512-dim rows over enough tokens for the prompt tile (32 heads a program; 4 SMs here)
    "prompt tile, 32 heads x 512": (8, 32, 512, 16, 40),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_kernel_matches_reference(case: tuple[int, ...], dtype: torch.dtype) -> None:
    args = make_case(*case, dtype)
    scale = case[2] ** -0.5
    out = sparse_sink_attention_triton(*args, scale)
    assert out.dtype == dtype and out.shape == args[0].shape
    torch.testing.assert_close(out.float(), sparse_sink_attention_ref(*args, scale).float(),
                               **TOLERANCE[dtype])


@pytest.mark.parametrize("splits", [1, 2, 3, 16])
def test_any_split_count_gives_the_same(splits: int) -> None:
    """16 splits over 50 entries: most splits are empty and must weigh nothing in the merge."""
    args = make_case(3, 5, 40, 9, 41, torch.float32, seed=1)
    out = sparse_sink_attention_triton(*args, 0.2, num_splits=splits)
    torch.testing.assert_close(out, sparse_sink_attention_ref(*args, 0.2),
                               **TOLERANCE[torch.float32])


@pytest.mark.parametrize("splits", [1, 3])
def test_a_query_with_no_entries_gives_zero(splits: int) -> None:
    """Only the sink is left, and it carries no value: 0, as in the reference (not NaN)."""
    q, kv_pool, entry_pool, window_slots, picked_slots, sinks = make_case(
        3, 4, 40, 6, 10, torch.float32, seed=2)
    window_slots[1] = -1
    picked_slots[1] = -1
    args = (q, kv_pool, entry_pool, window_slots, picked_slots, sinks)
    out = sparse_sink_attention_triton(*args, 0.3, num_splits=splits)
    ref = sparse_sink_attention_ref(*args, 0.3)
    assert torch.equal(ref[1], torch.zeros_like(ref[1]))
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out, ref, **TOLERANCE[torch.float32])


def test_no_entries_at_all() -> None:
    args = make_case(2, 3, 40, 0, 0, torch.float32)
    out = sparse_sink_attention_triton(*args, 0.5)
    assert torch.equal(out, torch.zeros_like(out))


def test_a_large_sink_takes_the_weight() -> None:
    """exp(sink) only joins the denominator: a sink far above every score drives the output
    to 0, one far below leaves plain softmax attention."""
    q, kv_pool, entry_pool, window_slots, picked_slots, _ = make_case(2, 3, 40, 5, 5,
                                                                      torch.float32)
    args = (q, kv_pool, entry_pool, window_slots, picked_slots)
    high = sparse_sink_attention_triton(*args, torch.full((3,), 60.0, device=DEVICE), 0.1)
    assert high.abs().max() < 1e-12
    low = sparse_sink_attention_triton(*args, torch.full((3,), -60.0, device=DEVICE), 0.1)
    entries = torch.cat([kv_pool[window_slots.clamp(min=0).long()],
                         entry_pool[picked_slots.clamp(min=0).long()]], dim=1)
    valid = torch.cat([window_slots, picked_slots], dim=1) >= 0
    scores = torch.einsum("thd,tkd->thk", q, entries).masked_fill(~valid[:, None], -torch.inf)
    plain = torch.einsum("thk,tkd->thd", torch.softmax(scores * 0.1, -1), entries)
    torch.testing.assert_close(low, plain, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("rope", [16, 40], ids=["rope16", "all-rope"])
def test_output_rotated_back_in_the_epilogue(splits: int, rope: int, dtype: torch.dtype) -> None:
    """With a rope table the stored output is the attention's, rounded, then rotated back at
    each query's position, in the kernel's store (one split) or the merge's (several); one
    position lies past the table (a padded row's) and reads its last row."""
    args = make_case(4, 5, 40, 9, 12, dtype, seed=4)
    table = rope_table(rope_frequencies(rope, 1e4), 50, dtype).to(DEVICE)
    positions = torch.tensor([0, 7, 49, 80], device=DEVICE)
    out = sparse_sink_attention_triton(*args, 0.2, num_splits=splits, positions=positions,
                                       rope_table=table)
    plain = sparse_sink_attention_ref(*args, 0.2)
    clamped = positions.clamp(max=49)
    ref = sparse_sink_attention_ref(*args, 0.2, positions=clamped, rope_table=table)
    torch.testing.assert_close(ref, rms_rotary_ref(plain, None, clamped, table, eps=None,
                                                   inverse=True), rtol=0, atol=0)
    assert not torch.equal(ref, plain)  # the rotation moved something
    torch.testing.assert_close(out.float(), ref.float(), **TOLERANCE[dtype])


def test_rope_table_needs_positions() -> None:
    args = make_case(2, 3, 40, 4, 4, torch.float32)
    table = rope_table(rope_frequencies(16, 1e4), 8, torch.float32).to(DEVICE)
    with pytest.raises(ValueError, match="positions"):
        sparse_sink_attention_triton(*args, 0.3, rope_table=table)


def test_op_runs_the_reference_on_cpu() -> None:
    args = make_case(2, 3, 40, 4, 4, torch.float32, device="cpu")
    assert torch.equal(sparse_sink_attention(*args, 0.3), sparse_sink_attention_ref(*args, 0.3))


def test_prompt_steps_take_the_wide_head_tiles() -> None:
    cpu = torch.device("cpu")  # the interpreter's 4 SMs: 8 tokens fill them twice
    assert plan(8, 64, 512, 640, cpu) == (64, 32, 1, 8)
    assert plan(8, 32, 512, 640, cpu) == (32, 64, 1, 8)
    assert plan(8, 32, 512, 640, cpu, fp8_entries=True) == (64, 32, 1, 8)
    assert plan(8, 16, 512, 640, cpu)[:2] == (16, 64)  # a TP4 rank's heads: unmeasured
    assert plan(7, 64, 512, 640, cpu)[:2] == (16, 64)  # too few tokens: the decode tile
    assert plan(8, 64, 128, 640, cpu)[0] == 64 and plan(8, 64, 128, 640, cpu)[3] == 4


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 64, 512])  # 512: the prompt tile on a GPU
@pytest.mark.parametrize("window,picked", [(128, 512), (128, 0)], ids=["csa/hca", "window"])
def test_v4_flash_shapes(tokens: int, window: int, picked: int) -> None:
    """64 heads x 512 dims, a 128-entry window and 512 picked entries (CSA's top 512, HCA at
    a 64k context), from pools of realistic size."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(tokens, 64, 512, generator=g).to(torch.bfloat16).cuda()
    kv_pool = torch.randn(4096, 512, generator=g).to(torch.bfloat16).cuda()
    entry_pool = torch.randn(8192, 512, generator=g).to(torch.bfloat16).cuda()
    window_slots = torch.randint(0, 4096, (tokens, window), generator=g,
                                 dtype=torch.int32).cuda()
    picked_slots = torch.randint(0, 8192, (tokens, picked), generator=g,
                                 dtype=torch.int32).cuda()
    picked_slots[:, -37:] = -1  # a query that sees fewer than 512 entries
    sinks = torch.randn(64, generator=g).cuda()
    args = (q, kv_pool, entry_pool, window_slots, picked_slots, sinks)
    out = sparse_sink_attention(*args, 512 ** -0.5)
    torch.testing.assert_close(out.float(),
                               sparse_sink_attention_ref(*args, 512 ** -0.5).float(),
                               **TOLERANCE[torch.bfloat16])
