"""The rounding DeepSeek-V4 applies inside its forward (`kernels/quant_sim/`, switched by
`quant_sim.py`): the references' FP8 and FP4 against brute force over the formats' values, the
Hadamard rotation's orthonormality, and when a checkpoint gets it. The kernels against these
references: kernels/test_quant_sim_kernels.py; the whole model with it against the official
code: test_official_reference.py."""

from __future__ import annotations

import math

import pytest
import torch

from openinfer_deepseek_v4.kernels.quant_sim import fp4_round, fp8_round, hadamard
from openinfer_deepseek_v4.quant_sim import QUANT_SIM_ENV, quant_sim_for


def nearest_even(value: float, grid: torch.Tensor, codes: torch.Tensor) -> float:
    """The grid value nearest `value`; on a tie, the one whose code is even."""
    d = (grid - value).abs()
    best = d == d.min()
    if best.sum() > 1:
        best &= codes % 2 == 0
    return float(grid[best][0])


def test_fp8_matches_brute_force() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 128, generator=g) * torch.tensor([1e-3, 1.0, 300.0])[:, None]
    got = fp8_round(x)
    codes = torch.arange(256, dtype=torch.uint8)
    values = codes.view(torch.float8_e4m3fn).float()
    finite = values.isfinite()
    for row in range(3):
        for block in range(2):
            part = x[row, 64 * block:64 * (block + 1)]
            amax = max(float(part.abs().max()), 1e-4)
            scale = 2.0 ** math.ceil(math.log2(amax / 448))
            for i in range(64):
                want = nearest_even(float(part[i]) / scale, values[finite],
                                    codes[finite].long()) * scale
                assert float(got[row, 64 * block + i]) == pytest.approx(want, rel=0, abs=0)


def test_fp8_is_idempotent_and_keeps_the_dtype() -> None:
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    once = fp8_round(x)
    assert once.dtype == torch.bfloat16
    assert torch.equal(fp8_round(once), once)


def test_fp4_rounds_to_nearest_with_ties_to_even() -> None:
    # amax 6: scale 1, so the block's values are e2m1's own
    x = torch.zeros(32)
    x[:10] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, 0.3])
    assert fp4_round(x)[:10].tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -1.0, 0.5]
    # amax 3: scale 0.5 (2^ceil(log2(3 / 6))); 0.6 / 0.5 = 1.2 -> 1.0 -> 0.5
    y = torch.zeros(32)
    y[:2] = torch.tensor([3.0, 0.6])
    assert fp4_round(y)[:2].tolist() == [3.0, 0.5]


def test_hadamard_is_an_orthonormal_involution() -> None:
    x = torch.randn(5, 128, dtype=torch.float64).float()
    torch.testing.assert_close(hadamard(hadamard(x)), x, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hadamard(x).norm(dim=-1), x.norm(dim=-1))
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard(torch.zeros(3, 96))


def test_which_checkpoints_round(monkeypatch: pytest.MonkeyPatch) -> None:
    quantized = {"quantization_config": {"quant_method": "fp8"}}
    monkeypatch.delenv(QUANT_SIM_ENV, raising=False)
    assert quant_sim_for(quantized) and not quant_sim_for({})
    monkeypatch.setenv(QUANT_SIM_ENV, "off")
    assert not quant_sim_for(quantized)
    monkeypatch.setenv(QUANT_SIM_ENV, "on")
    assert quant_sim_for({})
    monkeypatch.setenv(QUANT_SIM_ENV, "yes")
    with pytest.raises(ValueError, match="auto, on or off"):
        quant_sim_for({})
