"""The rounding kernels (`kernels/quant_sim/triton.py`) against their references: FP8 over pool
rows in place (the non-rotary dims only, repeated rows, bf16 and fp32), and the indexer's
Hadamard + FP4, new rows and pool rows in place.

FP8 is exact (the same division by a power of two, the same round-to-nearest-even). The
indexer's rotation is an fp32 product summed in another order than torch's, so a value within
that noise of an FP4 midpoint may round to the other neighbour: at most one FP4 step (twice
the block's scale), on a small share of the values."""

from __future__ import annotations

import pytest
import torch

from openinfer_deepseek_v4.kernels.quant_sim import (
    fp8_round_rows_ref,
    indexer_round_ref,
    indexer_round_rows_ref,
)
from openinfer_deepseek_v4.kernels.quant_sim.triton import (
    fp8_round_rows_triton,
    indexer_round_rows_triton,
    indexer_round_triton,
)

# The kernel runs compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FLIPS = 0.02  # the share of FP4 values allowed to round to the other neighbour


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("width", "rope"), [(512, 64), (80, 16)])
def test_fp8_rows_match_the_reference(dtype: torch.dtype, width: int, rope: int) -> None:
    g = torch.Generator().manual_seed(width)
    pool = (torch.randn(40, width, generator=g) * torch.logspace(-3, 2, 40)[:, None]).to(dtype)
    pool = pool.to(DEVICE)
    before = pool.clone()
    rows = torch.tensor([3, 0, 17, 17, -1, 39, 5], device=DEVICE)  # -1: skipped
    want = pool.clone()
    fp8_round_rows_ref(want, rows, rope)
    fp8_round_rows_triton(pool, rows, rope)
    assert torch.equal(pool, want)
    # the rows named were rounded (random values are not on the FP8 grid), their rotary dims
    # kept; the others untouched
    assert not torch.equal(pool[rows, :-rope], before[rows, :-rope])
    assert torch.equal(pool[:, -rope:], before[:, -rope:])
    others = torch.ones(40, dtype=torch.bool, device=DEVICE)
    others[rows[rows >= 0]] = False
    assert torch.equal(pool[others], before[others])


def _within_one_step(got: torch.Tensor, want: torch.Tensor) -> None:
    diff = (got.float() - want.float()).abs()
    blocks = want.float().unflatten(-1, (-1, 32)).abs().amax(-1, keepdim=True)
    step = (2 * blocks / 6).expand(*blocks.shape[:-1], 32).flatten(-2)  # two scales at most
    assert bool((diff <= step * 1.01 + 1e-30).all())
    assert (diff > 0).float().mean().item() <= FLIPS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [128, 32])
def test_indexer_rounding_matches_the_reference(dtype: torch.dtype, d: int) -> None:
    g = torch.Generator().manual_seed(d)
    q = torch.randn(7, 3, d, generator=g).to(dtype).to(DEVICE)  # [T, heads, d]
    _within_one_step(indexer_round_triton(q), indexer_round_ref(q))
    pool = torch.randn(30, d, generator=g).to(dtype).to(DEVICE)
    rows = torch.tensor([0, 0, 29, 4, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, -1],
                        device=DEVICE)  # 18 rows: two programs, one repeated, one skipped
    want = pool.clone()
    indexer_round_rows_ref(want, rows)
    indexer_round_rows_triton(pool, rows)
    _within_one_step(pool, want)
    others = torch.ones(30, dtype=torch.bool, device=DEVICE)
    others[rows[rows >= 0]] = False
    assert torch.equal(pool[others], want[others])


def test_widths_the_kernels_refuse() -> None:
    with pytest.raises(ValueError, match="whole blocks of 64"):
        fp8_round_rows_triton(torch.zeros(2, 100, device=DEVICE), torch.zeros(1, dtype=torch.long,
                                                                                device=DEVICE), 16)
    with pytest.raises(ValueError, match="power-of-two multiple of 32"):
        indexer_round_triton(torch.zeros(2, 96, device=DEVICE))
