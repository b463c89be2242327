"""FP8 block-scaled linear (weight e4m3 + one scale per 128 x 128 block, E8M0 or float32,
activations bf16/fp32) against its reference, dequantize-then-matmul in fp32: odd shapes whose
N and K no tile and no scale block divides, both kernel paths (one row on the CUDA cores, more
rows through tl.dot), K split into shares summed in a fixed order."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import openinfer_kernels.fp8_linear as fp8_linear
from openinfer_kernels import split_k
from openinfer_kernels.fp8_linear import (
    dequant_fp8_blocks_ref,
    fp8_block_linear_ref,
    fp8_grouped_linear_ref,
)
from openinfer_kernels.fp8_linear.triton import (
    Fp8Tile,
    fp8_block_linear_triton,
    fp8_grouped_linear_triton,
)

# The kernel runs compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# With E8M0 scales the dequantized weight is exact in both dtypes (e4m3 times a power of two);
# a float scale multiplies fp32 partial sums. Either way the only differences are the
# summation order (fp32: a few ulps of the largest partial sum, ~1e-5 at
# K ~ 300 and |terms| ~ 10) and, for bf16 output, its one rounding (2^-8 relative).
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-3), torch.bfloat16: dict(rtol=2**-7, atol=2e-2)}

TILES = {
    "heuristic": None,
    "rows1-k512-split2": Fp8Tile(1, 16, 512, split_k=2),
    "rows1-k64-split3": Fp8Tile(1, 16, 64, split_k=3),  # steps narrower than a scale block
    "dot-n32-k64-split3": Fp8Tile(16, 32, 64, split_k=3),
    "dot-n64-k128": Fp8Tile(16, 64, 128),
}


def make(m: int, n: int, k: int, dtype: torch.dtype, seed: int
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, an e4m3 weight and NaN-free scale bytes (2^-7 .. 2^3) on DEVICE."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((m, k), generator=g).to(dtype)
    w = (4 * torch.randn((n, k), generator=g)).to(torch.float8_e4m3fn)
    scale = torch.randint(120, 131, (-(-n // 128), -(-k // 128)), generator=g,
                          dtype=torch.uint8)
    return x.to(DEVICE), w.to(DEVICE), scale.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 150, 300), (3, 150, 300), (17, 200, 130),
                                           (2, 40, 70)])
def test_fp8_linear_matches_reference(m: int, n: int, k: int, tile: str,
                                      dtype: torch.dtype) -> None:
    x, w, scale = make(m, n, k, dtype, seed=m * 1000 + n + k)
    out = fp8_block_linear_triton(x, w, scale, tile=TILES[tile])
    assert out.shape == (m, n) and out.dtype == dtype
    torch.testing.assert_close(out.float(), fp8_block_linear_ref(x, w, scale).float(),
                               **TOL[dtype])


def float_scales(scale: torch.Tensor, seed: int) -> torch.Tensor:
    """float32 scales like HF's `weight_scale_inv` (block amax / 448: not powers of two),
    spread over the E8M0 range of `make` (2^-7 .. 2^3) on DEVICE."""
    g = torch.Generator().manual_seed(seed)
    return torch.exp2(torch.rand(scale.shape, generator=g) * 10 - 7).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 150, 300), (17, 200, 130), (17, 300, 260),
                                           (2, 40, 70)])
def test_float32_scales_match_the_dequantized_linear(m: int, n: int, k: int, tile: str,
                                                     dtype: torch.dtype) -> None:
    """HF's float32 block scales, partial blocks in both dims: the kernel gives the
    reference's product and F.linear's over the weight dequantized in fp32 (the float scale
    multiplies fp32 partial sums, so the tolerances are E8M0's)."""
    x, w, e8m0 = make(m, n, k, dtype, seed=m * 1000 + n + k)
    scale = float_scales(e8m0, seed=n + k)
    out = fp8_block_linear_triton(x, w, scale, tile=TILES[tile])
    assert out.shape == (m, n) and out.dtype == dtype
    ref = fp8_block_linear_ref(x.cpu(), w.cpu(), scale.cpu())
    torch.testing.assert_close(out.float().cpu(), ref.float(), **TOL[dtype])
    dense = dequant_fp8_blocks_ref(w.cpu(), scale.cpu(), dtype=torch.float32)
    want = F.linear(x.cpu().float(), dense)
    torch.testing.assert_close(out.float().cpu(), want, **TOL[dtype])
    assert torch.equal(ref, want.to(dtype))


def test_reference_is_the_dequantized_matmul() -> None:
    x, w, scale = make(3, 130, 260, torch.float32, seed=0)
    want = x.cpu() @ dequant_fp8_blocks_ref(w.cpu(), scale.cpu(), dtype=torch.float32).t()
    torch.testing.assert_close(fp8_block_linear_ref(x.cpu(), w.cpu(), scale.cpu()), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_dequant_reads_e8m0_and_float_scales(dtype: torch.dtype) -> None:
    """E8M0 bytes and their powers of two as float32 (HF's `weight_scale_inv` layout)
    dequantize alike; arbitrary float32 scales (amax / 448, HF's FP8 checkpoints) give each
    e4m3 value times its block's scale, in fp32, rounded once to `dtype`, partial blocks at
    the edges included."""
    _, w, scale = make(1, 150, 300, torch.float32, seed=3)
    w, scale = w.cpu(), scale.cpu()
    powers = torch.ldexp(torch.ones(scale.shape), scale.to(torch.int32) - 127)
    assert torch.equal(dequant_fp8_blocks_ref(w, powers, dtype=dtype),
                       dequant_fp8_blocks_ref(w, scale, dtype=dtype))
    floats = torch.rand(scale.shape, generator=torch.Generator().manual_seed(4)) / 448
    want = torch.empty(w.shape)
    for r in range(w.shape[0]):
        for c in range(w.shape[1]):
            want[r, c] = w[r, c].float() * floats[r // 128, c // 128]
    assert torch.equal(dequant_fp8_blocks_ref(w, floats, dtype=dtype), want.to(dtype))
    with pytest.raises(TypeError, match="E8M0 or float"):
        dequant_fp8_blocks_ref(w, scale.to(torch.int32))


def test_e8m0_scales_and_fp32_output() -> None:
    """float8_e8m0fnu scales read as their bytes; bf16 activations with an fp32 output keep
    the accumulator unrounded."""
    x, w, scale = make(5, 140, 200, torch.bfloat16, seed=1)
    out = fp8_block_linear_triton(x, w, scale.view(torch.float8_e8m0fnu),
                                  out_dtype=torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, fp8_block_linear_ref(x, w, scale, torch.float32),
                               rtol=1e-5, atol=1e-3)


def test_split_k_is_deterministic() -> None:
    x, w, scale = make(3, 100, 300, torch.bfloat16, seed=2)
    tile = TILES["dot-n32-k64-split3"]
    first = fp8_block_linear_triton(x, w, scale, tile=tile)
    assert all(torch.equal(first, fp8_block_linear_triton(x, w, scale, tile=tile))
               for _ in range(3))


@pytest.mark.parametrize("tile", ["rows1-k512-split2", "rows1-k64-split3", "dot-n32-k64-split3"])
@pytest.mark.parametrize("m", [1, 3, 17])
def test_the_last_share_sums_as_sum_slices_does(monkeypatch, m: int, tile: str) -> None:
    """A split launch's last program per output block adds the shares (the default) to the
    same bits as `sum_slices` (OPENINFER_SPLIT_SUM=kernel), and leaves every arrival count at
    0 for the next launch (or a CUDA graph's replay)."""
    x, w, scale = make(m, 100, 300, torch.bfloat16, seed=m)
    monkeypatch.setattr(split_k, "SERIAL_SUM", True)
    serial = [fp8_block_linear_triton(x, w, scale, tile=TILES[tile]) for _ in range(2)]
    counts = split_k.split_counters(x.device)
    assert counts is not None and not counts.any()
    monkeypatch.setattr(split_k, "SERIAL_SUM", False)
    kernel = fp8_block_linear_triton(x, w, scale, tile=TILES[tile])
    assert torch.equal(serial[0], kernel) and torch.equal(serial[1], kernel)


def test_bad_operands_are_refused() -> None:
    x, w, scale = make(2, 40, 70, torch.bfloat16, seed=3)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_block_linear_triton(x, w.float(), scale)
    with pytest.raises(ValueError, match=r"shape \(1, 1\)"):
        fp8_block_linear_triton(x, w, scale.repeat(2, 1))
    with pytest.raises(ValueError, match="E8M0 bytes or float32"):
        fp8_block_linear_triton(x, w, scale.to(torch.bfloat16))
    with pytest.raises(ValueError, match="K contiguous"):
        fp8_block_linear_triton(x.t().contiguous().t(), w, scale)


def test_the_dispatching_op_is_the_reference_on_cpu() -> None:
    x, w, scale = make(3, 40, 70, torch.float32, seed=4)
    x, w, scale = x.cpu(), w.cpu(), scale.cpu()
    assert torch.equal(fp8_linear.fp8_block_linear(x, w, scale), fp8_block_linear_ref(x, w, scale))


# V4-Flash's FP8 projections, weight [N, K] (spec §2, §5): q_a, q_b, kv, o_a's eight groups
# as one, o_b, the shared expert's gate_up and down, the indexer's q_b.
V4_SHAPES = [(1024, 4096), (32768, 1024), (512, 4096), (8192, 4096), (4096, 8192),
             (4096, 4096), (4096, 2048), (8192, 1024)]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7, 64, 2048])
@pytest.mark.parametrize(("n", "k"), V4_SHAPES)
def test_v4_flash_shapes(m: int, n: int, k: int) -> None:
    x, w, scale = make(m, n, k, torch.bfloat16, seed=m + n + k)
    out = fp8_block_linear_triton(x, w, scale)
    torch.testing.assert_close(out.float(), fp8_block_linear_ref(x, w, scale).float(),
                               rtol=2**-7, atol=0.5)  # |out| ~ 4 * 2^3 * sqrt(K): up to ~2000
    assert torch.equal(out, fp8_block_linear_triton(x, w, scale))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("m", "groups", "rows", "k"), [(1, 3, 128, 300), (5, 2, 256, 130),
                                                        (17, 3, 128, 70)])
def test_grouped_linear_is_each_groups_linear(m: int, groups: int, rows: int, k: int,
                                              dtype: torch.dtype) -> None:
    """One launch over every group gives what each group's own `fp8_block_linear` gives (the
    same tile and K split: the same bits), and the reference agrees; x's groups strided."""
    x, w, scale = make(m, groups * rows, k, dtype, seed=m + groups + k)
    wide = torch.randn(m, groups, k + 5, device=DEVICE).to(dtype)
    wide[..., 2:k + 2] = x[:, None, :] * torch.arange(1, groups + 1, device=DEVICE)[:, None]
    xg = wide[..., 2:k + 2]
    got = fp8_grouped_linear_triton(xg, w, scale)
    assert got.shape == (m, groups, rows) and got.dtype == dtype
    per = rows // 128
    for g in range(groups):
        alone = fp8_block_linear_triton(xg[:, g], w[g * rows:(g + 1) * rows],
                                        scale[g * per:(g + 1) * per])
        assert torch.equal(got[:, g], alone)
    want = fp8_grouped_linear_ref(xg.cpu(), w.cpu(), scale.cpu())
    torch.testing.assert_close(got.float().cpu(), want.float(), **TOL[dtype])


def test_grouped_linear_rejects_groups_off_the_scale_blocks() -> None:
    x, w, scale = make(2, 192, 64, torch.float32, seed=5)
    for op in (fp8_grouped_linear_triton, fp8_grouped_linear_ref):
        with pytest.raises(ValueError, match="multiple of 128"):
            op(x.view(2, 1, 64).expand(2, 2, 64), w, scale)
