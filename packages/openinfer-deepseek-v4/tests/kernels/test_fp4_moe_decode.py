"""The FP4 experts' decode path (a matrix-vector product per (token, expert) pair, no routing
step) against the reference and the grouped path: one to a few tokens, hidden and intermediate
sizes that no tile divides, experts repeated across and within tokens, zero routing weights,
hash routing, and down split in K shares and in shares of the slots."""

from __future__ import annotations

import pytest
import torch
from test_fp4_moe import DEVICE, LIMIT, make, tolerance

import openinfer_deepseek_v4.kernels.moe.triton as moe_triton
from openinfer_deepseek_v4.kernels.moe import fp4_moe_experts_ref, route_hash_ref
from openinfer_deepseek_v4.kernels.moe.decode import DECODE_TILES, DecodeTile, decode_tile
from openinfer_deepseek_v4.kernels.moe.triton import fp4_moe_experts_triton

HIDDEN, INTER = 96, 160  # 3 and 5 scale groups: no power-of-two tile divides them
TILES = {
    "default": None,
    # 64 gate_up rows of 160 (a partial block), 32-input steps, down in 3 K shares of 64, 64, 32.
    "split": DecodeTile(block_n=64, block_k=32, down_block_n=64, down_block_k=32, down_split=3),
    "wide_k": DecodeTile(block_n=8, block_k=256, down_block_n=32, down_block_k=128,
                         num_warps=2),
    # down's slots in 3 shares (of 2 slots at k = 6, of 1 at k = 3; 2 shares at k = 2, 1 at
    # k = 1), and in 2 shares with K in 2 too (at k = 3 a last share of 1 slot): each share
    # its own slice, summed in share order.
    "slot_split": DecodeTile(block_n=16, block_k=64, down_block_n=32, down_block_k=64,
                             down_slot_split=3),
    "slot_and_k_split": DecodeTile(block_n=16, block_k=64, down_block_n=32, down_block_k=64,
                                   down_split=2, down_slot_split=2),
}


def decode(case: dict[str, torch.Tensor], tile: DecodeTile | None = None,
           add: torch.Tensor | None = None) -> torch.Tensor:
    return fp4_moe_experts_triton(**case, limit=LIMIT, path="decode", tile=tile, add=add)


@pytest.mark.parametrize("tile", TILES.values(), ids=TILES.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "k"), [(1, 1), (1, 6), (2, 3), (5, 2), (8, 2)])
def test_decode_matches_reference(t: int, k: int, dtype: torch.dtype,
                                  tile: DecodeTile | None) -> None:
    case = make(t, HIDDEN, INTER, experts=7, k=k, dtype=dtype, seed=t * 10 + k)
    out = decode(case, tile)
    assert out.shape == (t, HIDDEN) and out.dtype == dtype
    want = fp4_moe_experts_ref(**{**case, "x": case["x"].float()}, limit=LIMIT)
    torch.testing.assert_close(out.float(), want, **tolerance(dtype, want))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decode_matches_grouped_path(dtype: torch.dtype) -> None:
    """Both round h to x's dtype and scale each slot's fp32 product before summing the slots
    in order: they differ in summation order within a product only."""
    case = make(4, HIDDEN, INTER, experts=5, k=3, dtype=dtype, seed=4)
    grouped = fp4_moe_experts_triton(**case, limit=LIMIT, path="grouped")
    torch.testing.assert_close(decode(case).float(), grouped.float(),
                               **tolerance(dtype, grouped.float()))


@pytest.mark.parametrize("tile", TILES.values(), ids=TILES.keys())
@pytest.mark.parametrize("path", ["decode", "grouped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_add_joins_the_sum(dtype: torch.dtype, path: str, tile: DecodeTile | None) -> None:
    """`add` (the shared expert's output, here of the experts' own scale and one row strided)
    lands in the sum: the decode path adds it in the down kernel (the first K share only)
    before the one rounding, the grouped path after; the reference adds it to its result."""
    case = make(3, HIDDEN, INTER, experts=5, k=2, dtype=dtype, seed=17)
    g = torch.Generator(DEVICE).manual_seed(17)
    add = (torch.randn((3, 2 * HIDDEN), generator=g, device=DEVICE) * 4).to(dtype)[:, ::2]
    out = fp4_moe_experts_triton(**case, limit=LIMIT, path=path, tile=tile, add=add)
    ref = fp4_moe_experts_ref(**{**case, "x": case["x"].float()}, limit=LIMIT,
                              add=add.float())
    torch.testing.assert_close(out.float(), ref, **tolerance(dtype, ref))
    without = fp4_moe_experts_triton(**case, limit=LIMIT, path=path, tile=tile)
    assert (out.float() - without.float() - add.float()).abs().max() < \
        (1e-4 if dtype == torch.float32 else 2**-6 * ref.abs().max().item())


def test_experts_repeated_across_and_within_tokens() -> None:
    case = make(4, HIDDEN, INTER, experts=4, k=3, dtype=torch.float32, seed=8)
    case["ids"] = torch.tensor([[2, 2, 0], [2, 0, 1], [0, 2, 2], [3, 3, 3]], device=DEVICE)
    want = fp4_moe_experts_ref(**case, limit=LIMIT)
    torch.testing.assert_close(decode(case, TILES["split"]), want, rtol=1e-4, atol=1e-4)


def test_zero_routing_weights() -> None:
    """A pair of weight 0 adds nothing (it is skipped, its expert unread); a token whose
    weights are all 0 comes out exactly 0."""
    case = make(3, HIDDEN, INTER, experts=5, k=3, dtype=torch.bfloat16, seed=9)
    case["weights"][0, 1] = 0.0
    case["weights"][2] = 0.0
    out = decode(case)
    want = fp4_moe_experts_ref(**{**case, "x": case["x"].float()}, limit=LIMIT)
    torch.testing.assert_close(out.float(), want, **tolerance(torch.bfloat16, want))
    assert torch.equal(out[2], torch.zeros_like(out[2]))


def test_zero_weight_rows_are_not_read() -> None:
    """A padded row (NaN input, routing weights 0) comes out 0 and leaves the others alone;
    the reference would give NaN there (0 * NaN)."""
    case = make(3, HIDDEN, INTER, experts=5, k=2, dtype=torch.float32, seed=10)
    want = fp4_moe_experts_ref(**case, limit=LIMIT)
    case["x"][1] = float("nan")
    case["weights"][1] = 0.0
    out = decode(case, TILES["split"])
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out[[0, 2]], want[[0, 2]], rtol=1e-4, atol=1e-4)


def test_hash_routing() -> None:
    """The hash layers' experts come from a token-id table (here with a repeat in a row) and
    go through the same entry point."""
    case = make(3, HIDDEN, INTER, experts=6, k=2, dtype=torch.float32, seed=12)
    tid2eid = torch.tensor([[0, 5], [4, 4], [1, 3], [5, 2]], device=DEVICE)
    logits = torch.randn((3, 6), generator=torch.Generator(DEVICE).manual_seed(1),
                         device=DEVICE)
    case["weights"], case["ids"] = route_hash_ref(logits, tid2eid,
                                                  torch.tensor([3, 1, 3], device=DEVICE), 1.5)
    want = fp4_moe_experts_ref(**case, limit=LIMIT)
    torch.testing.assert_close(decode(case), want, rtol=1e-4, atol=1e-4)


def test_int64_ids_and_strided_routing() -> None:
    """ids and weights as slices of wider tensors (rows not contiguous)."""
    case = make(2, HIDDEN, INTER, experts=5, k=4, dtype=torch.float32, seed=13)
    want = fp4_moe_experts_ref(**case, limit=LIMIT)
    wide = {"ids": torch.cat([case["ids"], case["ids"]], dim=1)[:, :4],
            "weights": torch.cat([case["weights"], case["weights"]], dim=1)[:, :4]}
    torch.testing.assert_close(decode({**case, **wide}), want, rtol=1e-4, atol=1e-4)


def test_few_pairs_take_the_decode_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moe_triton, "_CHOICE", None)  # as if OPENINFER_MOE were unset
    case = make(3, 64, 96, experts=5, k=2, dtype=torch.bfloat16, seed=14)
    assert moe_triton.takes_decode_path(moe_triton.DECODE_MAX_PAIRS)
    assert not moe_triton.takes_decode_path(moe_triton.DECODE_MAX_PAIRS + 1)
    assert torch.equal(fp4_moe_experts_triton(**case, limit=LIMIT), decode(case))
    monkeypatch.setattr(moe_triton, "DECODE_MAX_PAIRS", 5)  # 6 pairs: grouped
    assert torch.equal(fp4_moe_experts_triton(**case, limit=LIMIT),
                       fp4_moe_experts_triton(**case, limit=LIMIT, path="grouped"))


@pytest.mark.parametrize("choice", ["decode", "grouped"])
def test_openinfer_moe_forces_a_path(monkeypatch: pytest.MonkeyPatch, choice: str) -> None:
    """OPENINFER_MOE (read at import; set here as the module saw it) wins at every size."""
    monkeypatch.setattr(moe_triton, "_CHOICE", choice)
    assert all(moe_triton.takes_decode_path(pairs) == (choice == "decode")
               for pairs in (1, moe_triton.DECODE_MAX_PAIRS + 1))
    case = make(2, 64, 96, experts=5, k=2, dtype=torch.bfloat16, seed=16)
    assert torch.equal(fp4_moe_experts_triton(**case, limit=LIMIT),
                       fp4_moe_experts_triton(**case, limit=LIMIT, path=choice))


def test_decode_is_deterministic() -> None:
    case = make(2, HIDDEN, INTER, experts=5, k=3, dtype=torch.bfloat16, seed=15)
    first = decode(case, TILES["split"])
    assert all(torch.equal(first, decode(case, TILES["split"])) for _ in range(2))




def test_decode_tile_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from openinfer_deepseek_v4.kernels.moe import decode as moe_decode

    for table in (DECODE_TILES, *moe_decode.WIDTH_TILES.values()):
        bounds = [most for most, _ in table]
        assert bounds == sorted(bounds)
    assert decode_tile(1) is DECODE_TILES[0][1]
    assert decode_tile(10_000) is DECODE_TILES[-1][1]
    # a rank's narrower experts take their width's rows where the table has them
    narrow = ((4, DecodeTile(block_n=32)),)
    monkeypatch.setattr(moe_decode, "WIDTH_TILES", {512: narrow})
    assert decode_tile(1, 512) is narrow[0][1] and decode_tile(64, 512) is narrow[0][1]
    assert decode_tile(1, 1024) is DECODE_TILES[0][1]


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 2, 8, 16])
def test_v4_flash_shapes_decode(t: int) -> None:
    """H=4096, I=2048, E=256, k=6, bf16, against the bf16 reference; run twice: the same
    bits."""
    case = make(t, 4096, 2048, 256, 6, torch.bfloat16, seed=t, picked=256)
    out = fp4_moe_experts_triton(**case, limit=10.0, path="decode")
    want = fp4_moe_experts_ref(**case, limit=10.0).float()
    torch.testing.assert_close(out.float(), want, rtol=2**-5, atol=2**-5 * want.abs().max())
    assert torch.equal(out, fp4_moe_experts_triton(**case, limit=10.0, path="decode"))


@pytest.mark.parametrize("tile", ["split", "slot_split", "slot_and_k_split"])
def test_shares_summed_by_the_last_to_arrive_or_by_a_launch_alike(
        tile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Down's shares summed by the last share to arrive at its arrival count (the default)
    and by `sum_slices` after (`OPENINFER_SPLIT_SUM=kernel`): both add the fp32 shares in
    share order and round once, so the same bits; the counts are back at 0 after."""
    from openinfer_kernels import split_k

    case = make(3, HIDDEN, INTER, experts=7, k=6, dtype=torch.bfloat16, seed=23)
    g = torch.Generator(DEVICE).manual_seed(23)
    add = (torch.randn((3, HIDDEN), generator=g, device=DEVICE) * 4).to(torch.bfloat16)
    serial = decode(case, TILES[tile], add)
    counts = split_k.counts_for(case["x"].device, 1)
    assert counts is not None and not counts.any()
    monkeypatch.setattr(split_k, "SERIAL_SUM", False)
    assert torch.equal(decode(case, TILES[tile], add), serial)
