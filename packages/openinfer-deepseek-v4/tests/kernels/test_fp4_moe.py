"""Grouped FP4 experts (e2m1 codes two per byte, an E8M0 scale per 32 inputs) against the
reference: dequantize, then `moe_experts_ref`. Five experts with one never picked, experts
repeated across tokens, hidden and intermediate sizes that no tile divides. The calls name
the grouped path: at these few tokens the dispatch would pick the decode path, which
test_fp4_moe_decode.py covers."""

from __future__ import annotations

import pytest
import torch

import openinfer_deepseek_v4.kernels.moe as moe
from openinfer_deepseek_v4.kernels.moe import dequant_fp4_ref, fp4_moe_experts_ref, moe_experts_ref
from openinfer_deepseek_v4.kernels.moe.align import align_by_expert
from openinfer_deepseek_v4.kernels.moe.triton import (
    GroupedTile,
    fp4_moe_experts_triton,
    grouped_tile,
)

# The kernel runs compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LIMIT = 1.5  # small enough that the clamps bite at these sizes


def make(t: int, hidden: int, inter: int, experts: int, k: int, dtype: torch.dtype, seed: int,
         picked: int | None = None) -> dict[str, torch.Tensor]:
    """Random routing over the first `picked` experts (default all but the last), random
    codes, NaN-free scale bytes (2^-7 .. 2^-2: outputs of order 1)."""
    g = torch.Generator(DEVICE).manual_seed(seed)  # on the device: V4-Flash's are 3 GB
    picked = picked or experts - 1
    ids = torch.stack([torch.randperm(picked, generator=g, device=DEVICE)[:k]
                       for _ in range(t)])
    byte = dict(generator=g, dtype=torch.uint8, device=DEVICE)
    case = {"x": torch.randn((t, hidden), generator=g, device=DEVICE).to(dtype), "ids": ids,
            "weights": torch.rand((t, k), generator=g, device=DEVICE),
            "gate_up": torch.randint(0, 256, (experts, 2 * inter, hidden // 2), **byte),
            "gate_up_scale": torch.randint(120, 126, (experts, 2 * inter, hidden // 32), **byte),
            "down": torch.randint(0, 256, (experts, hidden, inter // 2), **byte),
            "down_scale": torch.randint(120, 126, (experts, hidden, inter // 32), **byte)}
    return case


def tolerance(dtype: torch.dtype, want: torch.Tensor) -> dict[str, float]:
    """fp32: summation order only. bf16: the reference here runs in fp32, the kernel rounds
    h (silu(gate) * up) to bf16 before the down GEMM as a bf16 forward does, 2^-9 relative per
    element, summed over I mixed-sign products, and rounds its output once: a percent of the
    output's scale covers both."""
    if dtype == torch.float32:
        return dict(rtol=1e-4, atol=1e-4)
    return dict(rtol=2**-6, atol=2**-6 * want.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "k"), [(1, 2), (3, 3), (17, 2)])
def test_fp4_moe_matches_reference(t: int, k: int, dtype: torch.dtype) -> None:
    case = make(t, hidden=96, inter=160, experts=5, k=k, dtype=dtype, seed=t * 10 + k)
    out = fp4_moe_experts_triton(**case, limit=LIMIT, path="grouped")
    assert out.shape == (t, 96) and out.dtype == dtype
    want = fp4_moe_experts_ref(**{**case, "x": case["x"].float()}, limit=LIMIT)
    torch.testing.assert_close(out.float(), want, **tolerance(dtype, want))


def test_many_rows_per_expert_use_wider_tiles() -> None:
    """40 tokens x 3 of 3 experts: 40 rows an expert, tiles of 64 rows (the prefill path)."""
    case = make(40, hidden=64, inter=96, experts=4, k=3, dtype=torch.float32, seed=7, picked=3)
    want = fp4_moe_experts_ref(**case, limit=LIMIT)
    torch.testing.assert_close(fp4_moe_experts_triton(**case, limit=LIMIT, path="grouped"),
                               want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tile", [GroupedTile(128, 64, 8, 3), GroupedTile(128, 128, 8, 2),
                                  GroupedTile(64, 128, 4, 3), GroupedTile(128)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_prompt_tiles_match_reference(tile: GroupedTile, dtype: torch.dtype) -> None:
    """The taller and wider tiles a prompt step may take (`dsv4_moe_prefill.py` measures them):
    150 tokens x 3 of 3 experts, 150 rows an expert (a full tile of 128 and a part); a width
    and hidden size that the 128-row tiles cut short."""
    case = make(150, hidden=96, inter=160, experts=4, k=3, dtype=dtype, seed=11, picked=3)
    out = fp4_moe_experts_triton(**case, limit=LIMIT, path="grouped", grouped=tile)
    want = fp4_moe_experts_ref(**{**case, "x": case["x"].float()}, limit=LIMIT)
    torch.testing.assert_close(out.float(), want, **tolerance(dtype, want))


def test_long_prompts_take_128_row_tiles_in_bf16() -> None:
    assert grouped_tile(8192 * 6, 256, fp32=False) == GroupedTile(128)  # 192 rows an expert
    assert grouped_tile(8192 * 6, 256, fp32=True) == GroupedTile(64, stages=2)
    assert grouped_tile(2048 * 6, 256, fp32=False) == GroupedTile(64)  # 48 rows an expert
    assert grouped_tile(6, 256, fp32=False) == GroupedTile(16)


def test_reference_is_moe_experts_ref_of_the_dequantized_weights() -> None:
    case = {n: v.cpu() for n, v in make(4, 64, 96, 5, 2, torch.float32, seed=3).items()}
    gate_up = torch.stack([dequant_fp4_ref(p, s, dtype=torch.float32)
                           for p, s in zip(case["gate_up"], case["gate_up_scale"], strict=True)])
    down = torch.stack([dequant_fp4_ref(p, s, dtype=torch.float32)
                        for p, s in zip(case["down"], case["down_scale"], strict=True)])
    want = moe_experts_ref(case["x"], case["ids"], case["weights"], gate_up, down, LIMIT)
    torch.testing.assert_close(fp4_moe_experts_ref(**case, limit=LIMIT), want)
    assert torch.equal(moe.fp4_moe_experts(**case, limit=LIMIT),
                       fp4_moe_experts_ref(**case, limit=LIMIT))


def test_alignment_tiles_each_expert_in_token_order() -> None:
    ids = torch.tensor([[3, 0], [0, 3], [3, 1]])  # pairs 0..5; expert 2 unused
    tiles = align_by_expert(ids, num_experts=4, block_m=2)
    assert tiles.pair.tolist() == [1, 2, 5, 0, 3, 4]  # expert 0: pairs 1, 2; 1: 5; 3: 0, 3, 4
    assert tiles.tile_expert.tolist() == [0, 1, 3, 3, -1, -1, -1, -1]
    assert tiles.tile_start.tolist() == [0, 2, 3, 5, 0, 0, 0, 0]
    assert tiles.tile_rows.tolist() == [2, 1, 2, 1, 0, 0, 0, 0]


def test_alignment_puts_other_ranks_pairs_in_a_bucket_after_the_experts() -> None:
    """Id -1 (expert parallelism: another rank's expert): bucket 4 of 4 experts, last."""
    ids = torch.tensor([[3, -1], [-1, 0], [-1, 3]])
    tiles = align_by_expert(ids, num_experts=4, block_m=2)
    assert tiles.pair.tolist() == [3, 0, 5, 1, 2, 4]  # 0: pair 3; 3: 0, 5; -1: 1, 2, 4
    assert tiles.tile_expert.tolist()[:4] == [0, 3, 4, 4]
    assert tiles.tile_start.tolist()[:4] == [0, 1, 3, 5]
    assert tiles.tile_rows.tolist()[:4] == [1, 2, 2, 1]
    assert set(tiles.tile_expert.tolist()[4:]) == {-1}


@pytest.mark.parametrize("path", ["grouped", "decode"])
@pytest.mark.parametrize("t", [1, 5])
def test_other_ranks_pairs_add_nothing(path: str, t: int) -> None:
    """Expert parallelism's local routes: pairs of id -1 carry weight 0 and are skipped; the
    rest give the reference over the same pairs."""
    case = make(t, hidden=64, inter=96, experts=4, k=3, dtype=torch.float32, seed=20 + t,
                picked=4)
    dropped = torch.zeros_like(case["ids"], dtype=torch.bool)
    dropped[:, 1] = True
    dropped[0, :] = True  # a token with no pair on this rank: output 0
    ids = torch.where(dropped, -1, case["ids"])
    weights = torch.where(dropped, 0.0, case["weights"])
    case = {**case, "ids": ids, "weights": weights}
    out = fp4_moe_experts_triton(**case, limit=LIMIT, path=path)
    want = fp4_moe_experts_ref(**case, limit=LIMIT)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    kept = ~dropped
    full = fp4_moe_experts_ref(**{**case, "ids": torch.where(kept, ids, 0),
                                  "weights": weights}, limit=LIMIT)
    torch.testing.assert_close(want, full, rtol=1e-5, atol=1e-6)
    # int32 ids (the kernels' "int") give the reference the same answer.
    assert torch.equal(fp4_moe_experts_ref(**{**case, "ids": ids.int()}, limit=LIMIT), want)


def test_is_deterministic() -> None:
    case = make(9, 64, 96, 5, 3, torch.bfloat16, seed=11)
    first = fp4_moe_experts_triton(**case, limit=LIMIT, path="grouped")
    assert all(torch.equal(first, fp4_moe_experts_triton(**case, limit=LIMIT, path="grouped"))
               for _ in range(2))


def test_bad_shapes_are_refused() -> None:
    case = make(2, 64, 96, 3, 2, torch.bfloat16, seed=5)
    with pytest.raises(ValueError, match="down_scale must be"):
        fp4_moe_experts_triton(**{**case, "down_scale": case["down_scale"][:, :, :1]},
                               limit=LIMIT)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 64])
def test_v4_flash_shapes(t: int) -> None:
    """H=4096, I=2048, E=256, k=6, bf16, against the bf16 reference (which rounds its
    products to bf16 too); run twice: the same bits."""
    case = make(t, 4096, 2048, 256, 6, torch.bfloat16, seed=t, picked=256)
    out = fp4_moe_experts_triton(**case, limit=10.0, path="grouped")
    want = fp4_moe_experts_ref(**case, limit=10.0).float()
    torch.testing.assert_close(out.float(), want, rtol=2**-5, atol=2**-5 * want.abs().max())
    assert torch.equal(out, fp4_moe_experts_triton(**case, limit=10.0, path="grouped"))
