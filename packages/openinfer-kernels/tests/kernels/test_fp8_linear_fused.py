"""The FP8 linear's decode-step fusions against their references: `fp8_block_linear_silu_mul`
(a gated MLP's [gate; up] FP8 weight, silu * mul in the product's epilogue or in its split-K
sum) and `fp8_block_linear_add_rms_norm` (a split product's shares summed by the add + norm
kernel). One row and a few, split and unsplit tiles of both kernel paths, E8M0 and float32
scales. Where K is split, both are the unfused Triton ops bit for bit (the same shares, summed
in the same order, rounded the same way), and they launch fewer kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from test_fp8_linear import DEVICE, float_scales, make

import openinfer_kernels.fp8_linear as fp8_linear
import openinfer_kernels.fp8_linear.triton as fp8_triton
from openinfer_kernels import split_k
from openinfer_kernels.activation.triton import silu_and_mul_triton
from openinfer_kernels.fp8_linear import (
    fp8_block_linear_add_rms_norm_ref,
    fp8_block_linear_silu_mul_ref,
)
from openinfer_kernels.fp8_linear.triton import (
    Fp8Tile,
    fp8_block_linear_add_rms_norm_triton,
    fp8_block_linear_silu_mul_triton,
    fp8_block_linear_triton,
)
from openinfer_kernels.norm.triton import fused_add_rms_norm_triton

# fp32: the products' summation order (a few ulps of ~100, far under atol). bf16: a product
# summed in another order may round to the neighbouring bf16 value (2^-7 relative at most;
# the interpreter's casts truncate, so its roundings may each land one ulp off), and the norm
# rounds once more after it; silu * mul takes two products and rounds twice, as
# test_gemm's gated linear allows.
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-3), torch.bfloat16: dict(rtol=2**-6, atol=4e-2)}
# In fp32, a product's error (a few ulps of its partial sums, ~1e-4) is multiplied by the
# other product (~100).
SILU_TOL = {torch.float32: dict(rtol=1e-4, atol=2e-2),
            torch.bfloat16: dict(rtol=2**-5, atol=5e-2)}
# The residual add of a bf16 product (~100: an ulp of 0.5) and a residual of that size can
# cancel, so the sum is off by up to an ulp of its addends, not of itself.
SUM_TOL = {**TOL, torch.bfloat16: dict(rtol=2**-6, atol=1.0)}

# K = 300 in the tests: "split" tiles give K 2-3 shares, the others one.
TILES = {
    "heuristic": None,
    "rows1-k512": Fp8Tile(1, 16, 512),
    "rows1-k128-split3": Fp8Tile(1, 16, 128, split_k=3),
    "dot-n64-k128": Fp8Tile(16, 64, 128),
    "dot-n32-k64-split3": Fp8Tile(16, 32, 64, split_k=3),
}
# A very negative gate: e^-gate is inf, silu -0 (the interpreter's numpy warns of it).
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
# E8M0 scales (exact in bf16) and float32 ones (which multiply fp32 partial sums), bf16 and
# fp32 activations.
SCALES_DTYPES = [pytest.param("e8m0", torch.bfloat16, id="e8m0-bf16"),
                 pytest.param("float32", torch.bfloat16, id="float32-bf16"),
                 pytest.param("float32", torch.float32, id="float32-fp32")]
SPLIT = {name for name, tile in TILES.items() if tile is not None and tile.split_k > 1}
K = 300


def operands(m: int, n: int, dtype: torch.dtype, scales: str, seed: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [m, K], an e4m3 weight [n, K] and its block scales (E8M0 bytes or float32) on DEVICE."""
    x, w, scale = make(m, n, K, dtype, seed)
    return x, w, scale if scales == "e8m0" else float_scales(scale, seed)


def norm_operands(m: int, n: int, dtype: torch.dtype, seed: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """A residual stream [m, n] of the product's size (~70) and a norm weight near 1."""
    g = torch.Generator().manual_seed(seed)
    residual = (50 * torch.randn((m, n), generator=g)).to(dtype)
    weight = (1 + 0.1 * torch.randn((n,), generator=g)).to(dtype)
    return residual.to(DEVICE), weight.to(DEVICE)


@pytest.mark.parametrize(("scales", "dtype"), SCALES_DTYPES)
@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize(("m", "inter"), [(1, 256), (3, 128)])
def test_silu_mul_matches_reference(m: int, inter: int, tile: str, scales: str,
                                    dtype: torch.dtype) -> None:
    x, w, scale = operands(m, 2 * inter, dtype, scales, seed=m + inter)
    out = fp8_block_linear_silu_mul_triton(x, w, scale, tile=TILES[tile])
    assert out.shape == (m, inter) and out.dtype == dtype
    want = fp8_block_linear_silu_mul_ref(x.cpu(), w.cpu(), scale.cpu())
    torch.testing.assert_close(out.cpu().float(), want.float(), **SILU_TOL[dtype])
    if tile in SPLIT:  # the plain product's shares; the sum applies silu_and_mul's roundings
        unfused = silu_and_mul_triton(fp8_block_linear_triton(x, w, scale, tile=TILES[tile]))
        assert torch.equal(out, unfused)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("tile", ["rows1-k512", "rows1-k128-split3", "dot-n64-k128",
                                  "dot-n32-k64-split3"])
def test_clamped_silu_mul_matches_reference(tile: str, dtype: torch.dtype) -> None:
    """With a limit (DeepSeek-V4's clamped SwiGLU) in the epilogue and in the split sum: the
    reference with the same limit, which the products (~100) do reach."""
    limit = 10.0
    x, w, scale = operands(3, 256, dtype, "e8m0", seed=7)
    out = fp8_block_linear_silu_mul_triton(x, w, scale, tile=TILES[tile], limit=limit)
    want = fp8_block_linear_silu_mul_ref(x.cpu(), w.cpu(), scale.cpu(), limit=limit)
    torch.testing.assert_close(out.cpu().float(), want.float(), **SILU_TOL[dtype])
    unclamped = fp8_block_linear_silu_mul_ref(x.cpu(), w.cpu(), scale.cpu())
    assert (want - unclamped).abs().max() > 1.0  # the limit bites
    assert want.abs().max() <= limit * limit  # silu(g) <= g <= limit, |up| <= limit


@pytest.mark.parametrize(("scales", "dtype"), SCALES_DTYPES)
@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize(("m", "n"), [(1, 96), (3, 200)])
def test_add_rms_norm_matches_reference(m: int, n: int, tile: str, scales: str,
                                        dtype: torch.dtype) -> None:
    x, w, scale = operands(m, n, dtype, scales, seed=m + n)
    residual, weight = norm_operands(m, n, dtype, seed=n)
    normed, summed = fp8_block_linear_add_rms_norm_triton(x, w, scale, residual, weight, 1e-6,
                                                          tile=TILES[tile])
    assert normed.shape == summed.shape == (m, n) and normed.dtype == summed.dtype == dtype
    want_normed, want_summed = fp8_block_linear_add_rms_norm_ref(
        x.cpu(), w.cpu(), scale.cpu(), residual.cpu(), weight.cpu(), 1e-6)
    torch.testing.assert_close(summed.cpu().float(), want_summed.float(), **SUM_TOL[dtype])
    torch.testing.assert_close(normed.cpu().float(), want_normed.float(), **TOL[dtype])
    # The unfused ops at the same tile: the same numbers, split or not.
    unfused = fused_add_rms_norm_triton(fp8_block_linear_triton(x, w, scale, tile=TILES[tile]),
                                        residual, weight, 1e-6)
    assert torch.equal(normed, unfused[0]) and torch.equal(summed, unfused[1])


class Launches:
    """Counts the calls of the launchers the fused ops could fall back on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for name in ("sum_slices", "fused_add_rms_norm_triton", "split_sum_add_rms_norm_triton"):
            monkeypatch.setattr(fp8_triton, name, self._spy(name, getattr(fp8_triton, name)))

    def _spy(self, name: str, launcher: Callable[..., Any]) -> Callable[..., Any]:
        def spy(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return launcher(*args, **kwargs)

        return spy


def test_a_split_product_sums_its_shares_in_the_fused_kernel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Split K, the add + norm takes the shares (no `sum_slices`, no second norm launch) and
    the gated product's last share sums and gates them in the same launch (`sum_slices`, which
    applies silu * mul, only with OPENINFER_SPLIT_SUM=kernel); unsplit, the gated product is
    one launch and the add + norm falls back on the two ops."""
    launches = Launches(monkeypatch)
    x, w, scale = operands(1, 256, torch.bfloat16, "e8m0", seed=7)
    residual, weight = norm_operands(1, 256, torch.bfloat16, seed=7)
    split, whole = TILES["rows1-k128-split3"], TILES["rows1-k512"]
    fp8_block_linear_add_rms_norm_triton(x, w, scale, residual, weight, 1e-6, tile=split)
    assert launches.calls == ["split_sum_add_rms_norm_triton"]
    launches.calls.clear()
    fp8_block_linear_add_rms_norm_triton(x, w, scale, residual, weight, 1e-6, tile=whole)
    assert launches.calls == ["fused_add_rms_norm_triton"]
    launches.calls.clear()
    fp8_block_linear_silu_mul_triton(x, w, scale, tile=split)
    assert launches.calls == []
    monkeypatch.setattr(split_k, "SERIAL_SUM", False)
    fp8_block_linear_silu_mul_triton(x, w, scale, tile=split)
    assert launches.calls == ["sum_slices"]
    launches.calls.clear()
    fp8_block_linear_silu_mul_triton(x, w, scale, tile=whole)
    assert launches.calls == []


@pytest.mark.parametrize("limit", [None, 0.7], ids=["silu", "clamped"])
@pytest.mark.parametrize("tile", ["rows1-k128-split3", "dot-n32-k64-split3"])
@pytest.mark.parametrize("m", [1, 3, 17])
def test_the_gated_products_last_share_gates_as_sum_slices_does(
        monkeypatch: pytest.MonkeyPatch, m: int, tile: str, limit: float | None) -> None:
    """A split gated product summed and gated by its last share per output block (one launch)
    gives `sum_slices`'s bits (OPENINFER_SPLIT_SUM=kernel), clamped or not, and leaves every
    arrival count at 0 for the next launch."""
    x, w, scale = operands(m, 192, torch.bfloat16, "e8m0", seed=11 + m)
    monkeypatch.setattr(split_k, "SERIAL_SUM", True)
    serial = [fp8_block_linear_silu_mul_triton(x, w, scale, tile=TILES[tile], limit=limit)
              for _ in range(2)]
    counts = split_k.split_counters(x.device)
    assert counts is not None and not counts.any()
    monkeypatch.setattr(split_k, "SERIAL_SUM", False)
    kernel = fp8_block_linear_silu_mul_triton(x, w, scale, tile=TILES[tile], limit=limit)
    assert torch.equal(serial[0], kernel) and torch.equal(serial[1], kernel)
    want = fp8_block_linear_silu_mul_ref(x, w, scale, limit=limit)
    torch.testing.assert_close(kernel, want, **SILU_TOL[torch.bfloat16])


def test_bad_operands_are_refused() -> None:
    x, w, scale = operands(2, 256, torch.float32, "e8m0", seed=8)
    residual, weight = norm_operands(2, 256, torch.float32, seed=8)
    with pytest.raises(ValueError, match=r"\[gate; up\]"):
        fp8_block_linear_silu_mul_triton(x, w[:255], scale)
    with pytest.raises(ValueError, match=r"residual must be \[2, 256\]"):
        fp8_block_linear_add_rms_norm_triton(x, w, scale, residual[:, :128], weight, 1e-6)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_block_linear_silu_mul_triton(x, w.float(), scale)
    with pytest.raises(ValueError, match="block_n >= 32"):
        fp8_block_linear_silu_mul_triton(x, w, scale, tile=Fp8Tile(16, 16, 64))


def test_the_dispatching_ops_are_the_references_on_cpu() -> None:
    x, w, scale = (t.cpu() for t in operands(3, 256, torch.float32, "float32", seed=9))
    residual, weight = (t.cpu() for t in norm_operands(3, 256, torch.float32, seed=9))
    assert torch.equal(fp8_linear.fp8_block_linear_silu_mul(x, w, scale),
                       fp8_block_linear_silu_mul_ref(x, w, scale))
    got = fp8_linear.fp8_block_linear_add_rms_norm(x, w, scale, residual, weight, 1e-6)
    want = fp8_block_linear_add_rms_norm_ref(x, w, scale, residual, weight, 1e-6)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def weight_on_device(n: int, k: int, scales: str, seed: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """A Qwen3-sized e4m3 weight (|w| ~ 1/4) and its block scales, made on DEVICE."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    w = (torch.randn((n, k), generator=g, device=DEVICE) / 4).to(torch.float8_e4m3fn)
    scale = torch.full((n // 128, k // 128), 127, dtype=torch.uint8, device=DEVICE)  # 2^0
    return w, scale if scales == "e8m0" else float_scales(scale, seed) / 16


# Qwen3-8B's gate_up ([2 x 12288, 4096]), o_proj ([4096, 4096]) and down ([4096, 12288])
# at decode sizes, compiled, each at the heuristic's tile: the fused ops against the unfused.
@pytest.mark.gpu
@pytest.mark.parametrize("scales", ["e8m0", "float32"])
@pytest.mark.parametrize("m", [1, 4, 16, 48])
def test_qwen3_8b_decode_shapes(m: int, scales: str) -> None:
    g = torch.Generator(device=DEVICE).manual_seed(m)
    x = torch.randn((m, 4096), generator=g, device=DEVICE).to(torch.bfloat16)
    w, scale = weight_on_device(2 * 12288, 4096, scales, seed=m)
    out = fp8_block_linear_silu_mul_triton(x, w, scale)
    want = silu_and_mul_triton(fp8_block_linear_triton(x, w, scale))
    torch.testing.assert_close(out.float(), want.float(), **SILU_TOL[torch.bfloat16])
    for k in (4096, 12288):
        xk = torch.randn((m, k), generator=g, device=DEVICE).to(torch.bfloat16)
        w, scale = weight_on_device(4096, k, scales, seed=m + k)
        residual, weight = norm_operands(m, 4096, torch.bfloat16, seed=m + k)
        fused = fp8_block_linear_add_rms_norm_triton(xk, w, scale, residual, weight, 1e-6)
        unfused = fused_add_rms_norm_triton(fp8_block_linear_triton(xk, w, scale), residual,
                                            weight, 1e-6)
        assert torch.equal(fused[0], unfused[0]) and torch.equal(fused[1], unfused[1])
