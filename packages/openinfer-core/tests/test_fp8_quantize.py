"""Online FP8 quantization (`weights.fp8_quantize`, `--quantization fp8`): 128 x 128 block
scales = block amax / 448; dequant(quant(w)) is within half an e4m3 step of w (relative 2^-4
of |w| in e4m3's normal range, scale x 2^-10 below it, where e4m3's subnormal step is
scale x 2^-9), exactly w where w already sits on the grid; and the `--quantization` values
the engine does not implement are refused with the accepted ones."""

from __future__ import annotations

import pytest
import torch

from openinfer_core.engine.config import EngineConfig
from openinfer_core.errors import InvalidParameterError, ModelConfigError
from openinfer_core.weights.fp8_quantize import E4M3_MAX, quantize_block_fp8
from openinfer_core.weights.quantization import online_method

BLOCK = 128


def _dequant(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    rows, cols = q.shape
    s = scale.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return q.float() * s


def _scales_per_element(scale: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return scale.repeat_interleave(BLOCK, 0)[:shape[0]].repeat_interleave(BLOCK, 1)[:, :shape[1]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(300, 200), (128, 128), (1, 5), (257, 129)], ids=str)
def test_dequantized_weight_is_within_half_an_e4m3_step(shape: tuple[int, int],
                                                        dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    # Blocks of very different magnitudes, and small values beside large ones in a block
    # (some fall in e4m3's subnormal range).
    w = torch.randn(shape, generator=gen) * torch.logspace(-4, 1, shape[1])[None, :]
    w = w.to(dtype)
    got = quantize_block_fp8(w)
    assert got.weight.dtype == torch.float8_e4m3fn and got.weight.shape == w.shape
    assert got.scale.dtype == torch.float32 and got.block == (BLOCK, BLOCK)
    assert got.scale.shape == (-(-shape[0] // BLOCK), -(-shape[1] // BLOCK))
    # Each block's largest value maps to e4m3's largest: scale = amax / 448.
    for i in range(got.scale.shape[0]):
        for j in range(got.scale.shape[1]):
            block = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK].float()
            assert got.scale[i, j] == block.abs().max() / E4M3_MAX
            codes = got.weight[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK].float()
            assert codes.abs().max() == E4M3_MAX
    err = (_dequant(got.weight, got.scale) - w.float()).abs()
    step = torch.maximum(w.float().abs() * 2.0 ** -4,
                         _scales_per_element(got.scale, w.shape) * 2.0 ** -10)
    assert (err <= step * (1 + 1e-6)).all(), (err / step).max()


def test_values_on_the_grid_come_back_exactly() -> None:
    """Every finite e4m3 value, times a power-of-two scale per block, with 448 in each block
    (so amax / 448 is that scale): quantizing gives back the codes and the scale, bit for
    bit, and the dequantized weight is w (bf16 holds e4m3 x 2^k exactly)."""
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[grid.isfinite()]
    gen = torch.Generator().manual_seed(2)
    codes = grid[torch.randint(len(grid), (256, 384), generator=gen)]
    codes[::BLOCK, ::BLOCK] = E4M3_MAX
    scale = 2.0 ** torch.randint(-12, 3, (2, 3), generator=gen).float()
    w = (codes * _scales_per_element(scale, codes.shape)).to(torch.bfloat16)
    assert torch.equal(w.float(), codes * _scales_per_element(scale, codes.shape))
    got = quantize_block_fp8(w)
    assert torch.equal(got.scale, scale)
    assert torch.equal(got.weight.float(), codes)
    assert torch.equal(_dequant(got.weight, got.scale), w.float())


def test_an_all_zero_block_quantizes_to_zeros() -> None:
    w = torch.zeros(130, 256)
    w[128:, 128:] = 1.0
    got = quantize_block_fp8(w)
    assert got.scale.isfinite().all() and got.scale[0, 0] > 0
    assert torch.equal(_dequant(got.weight, got.scale), w)


def test_quantization_values_the_engine_does_not_implement_are_refused() -> None:
    with pytest.raises(InvalidParameterError,
                       match=r"quantization: 'awq' is not implemented \(accepted: fp8, or "
                             r"None: the checkpoint as stored\)"):
        EngineConfig(model="m", quantization="awq")
    assert EngineConfig(model="m", quantization="fp8").quantization == "fp8"
    with pytest.raises(ModelConfigError, match=r"--quantization 'int8' is not implemented "
                                               r"\(accepted: fp8, or None"):
        online_method("int8", {})


@pytest.mark.parametrize(("config", "want"), [
    ({}, "fp8"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}, None),
    ({"quantization_config": {"quant_method": "compressed-tensors"}}, None),
], ids=["bf16", "fp8-checkpoint", "compressed-tensors"])
def test_online_method_by_checkpoint(config: dict[str, object], want: str | None) -> None:
    assert online_method("fp8", config) == want
    assert online_method(None, config) is None


def test_fp8_on_a_checkpoint_quantized_otherwise_is_refused() -> None:
    config = {"quantization_config": {"quant_method": "awq", "bits": 4}}
    with pytest.raises(ModelConfigError, match=r"--quantization fp8 quantizes an unquantized "
                                               r"checkpoint at load, but this one's config.json "
                                               r"declares quantization_config.quant_method "
                                               r"'awq': leave out --quantization"):
        online_method("fp8", config)
