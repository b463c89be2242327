"""Small-batch linear kernels against the fp32 reference, at odd shapes (rows, columns and K
that no tile divides) and with K split so that some splits are short or empty."""

from __future__ import annotations

import pytest
import torch

import openinfer_kernels
from openinfer_kernels import split_k
from openinfer_kernels.activation import silu_and_mul_ref
from openinfer_kernels.gemm import linear_ref, tiles
from openinfer_kernels.gemm.triton import Tile, linear_triton

# The kernel runs compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# fp32 sums in another order than the reference's: a few ulps of the largest partial sum. bf16:
# the one rounding of the output, plus that.
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=2**-7, atol=1e-2)}

TILES = {
    "n16-k32": Tile(16, 32),
    "n16-k32-split3": Tile(16, 32, split_k=3),
    "n32-k64-split4": Tile(32, 64, split_k=4),  # K=100: the last split is empty
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 5, 7), (1, 40, 100), (3, 40, 100),
                                           (17, 33, 70), (32, 16, 32)])
def test_linear_matches_reference(m: int, n: int, k: int, tile: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(m * 10_000 + n * 100 + k)
    x = torch.randn((m, k), generator=g).to(dtype).to(DEVICE)
    w = torch.randn((n, k), generator=g).to(dtype).to(DEVICE)
    out = linear_triton(x, w, TILES[tile])
    assert out.shape == (m, n) and out.dtype == dtype
    torch.testing.assert_close(out.float(), linear_ref(x, w).float(), **TOL[dtype])


@pytest.mark.parametrize("tile", ["n16-k32", "n32-k64-split4"])
def test_fp32_out_keeps_the_accumulator_unrounded(tile: str) -> None:
    """bf16 operands, fp32 output (the vocabulary projection's logits): the fp32 sums as they
    are, not rounded to bf16 on the way out."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn((2, 100), generator=g).bfloat16().to(DEVICE)
    w = torch.randn((40, 100), generator=g).bfloat16().to(DEVICE)
    out = linear_triton(x, w, TILES[tile], out_dtype=torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, x.float() @ w.float().t(), rtol=1e-5, atol=1e-4)
    assert (out != out.bfloat16().float()).float().mean() > 0.9


def test_split_k_is_deterministic() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn((3, 100), generator=g).to(DEVICE)
    w = torch.randn((40, 100), generator=g).to(DEVICE)
    first = linear_triton(x, w, TILES["n16-k32-split3"])
    assert all(torch.equal(first, linear_triton(x, w, TILES["n16-k32-split3"]))
               for _ in range(3))


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("tile", ["n16-k32-split3", "n32-k64-split4"])
@pytest.mark.parametrize("m", [1, 3, 17])
def test_the_last_share_sums_as_the_sum_kernel_does(monkeypatch, m: int, tile: str,
                                                    gated: bool) -> None:
    """A split launch's last program per column block adds the shares (the default) to the
    same bits as the separate sum kernel (OPENINFER_SPLIT_SUM=kernel), and leaves every
    arrival count at 0, so the next launch (or a CUDA graph's replay) starts from zero."""
    g = torch.Generator().manual_seed(m * 7 + len(tile))
    x = torch.randn((m, 100), generator=g).bfloat16().to(DEVICE)
    w = torch.randn((80 if gated else 40, 100), generator=g).bfloat16().to(DEVICE)
    monkeypatch.setattr(split_k, "SERIAL_SUM", True)
    serial = [linear_triton(x, w, TILES[tile], gated=gated) for _ in range(2)]
    counts = split_k.split_counters(x.device)
    assert counts is not None and not counts.any()
    monkeypatch.setattr(split_k, "SERIAL_SUM", False)
    kernel = linear_triton(x, w, TILES[tile], gated=gated)
    assert torch.equal(serial[0], kernel) and torch.equal(serial[1], kernel)


@pytest.mark.parametrize("tile", ["n16-k32-split3", "n32-k64-split4"])
@pytest.mark.parametrize("m", [1, 3])
def test_the_shares_summed_are_the_linear(m: int, tile: str) -> None:
    """`linear_shares_triton`'s unsummed shares, summed in share order and rounded
    (`sum_shares_triton`, the dispatching `sum_shares`), are `linear_triton`'s result bit for
    bit: what a kernel that sums them itself must give (the push all-reduce's shares form)."""
    from openinfer_kernels.gemm import sum_shares
    from openinfer_kernels.gemm.triton import linear_shares_triton, sum_shares_triton

    g = torch.Generator().manual_seed(m + len(tile))
    x = torch.randn((m, 100), generator=g).bfloat16().to(DEVICE)
    w = torch.randn((40, 100), generator=g).bfloat16().to(DEVICE)
    shares = linear_shares_triton(x, w, TILES[tile])
    assert shares.shape == (TILES[tile].split_k, m, 40) and shares.dtype == torch.float32
    want = linear_triton(x, w, TILES[tile])
    assert torch.equal(sum_shares_triton(shares, torch.bfloat16), want)
    if DEVICE == "cuda":
        assert torch.equal(sum_shares(shares, torch.bfloat16), want)
    with pytest.raises(ValueError, match="split-K"):
        linear_shares_triton(x, w, Tile(16, 32))


def test_no_shares_where_linear_runs_no_split_tile() -> None:
    """The dispatching op answers None (nothing run) on CPU and for unsplit tiles."""
    from openinfer_kernels.gemm import linear_shares

    assert linear_shares(torch.zeros(1, 64), torch.zeros(32, 64)) is None


def test_a_strided_weight_is_refused() -> None:
    x = torch.zeros((2, 8), device=DEVICE)
    with pytest.raises(ValueError, match="K-contiguous"):
        linear_triton(x, torch.zeros((8, 4), device=DEVICE).t(), TILES["n16-k32"])
    with pytest.raises(ValueError, match="M <= 32"):
        linear_triton(torch.zeros((33, 8), device=DEVICE), torch.zeros((4, 8), device=DEVICE),
                      TILES["n16-k32"])


def test_the_dispatching_op_is_f_linear_on_cpu() -> None:
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn((3, 40), generator=g), torch.randn((24, 40), generator=g)
    assert torch.equal(openinfer_kernels.linear(x, w), torch.nn.functional.linear(x, w))


def test_the_tile_table_covers_small_batches_only() -> None:
    n, k = next(iter(tiles.TILES))
    assert tiles.tile_for(1, n, k) == tiles.TILES[(n, k)][0]
    assert tiles.tile_for(16, n, k) == tiles.TILES[(n, k)][1]
    assert tiles.tile_for(17, n, k) is None
    assert tiles.tile_for(1, n + 1, k) is None  # a shape nobody measured: cuBLAS


def test_a_fused_sum_takes_its_own_tile(monkeypatch):
    """`SUM_FUSED_TILES` overrides `TILES` for the products whose split-K shares the add +
    norm sums (`linear_add_rms_norm`), and only for those."""
    (n, k), (one, _) = next(iter(tiles.TILES.items()))
    split = Tile(8, 256, 4)
    monkeypatch.setattr(tiles, "SUM_FUSED_TILES", {(n, k): (split, None)})
    assert tiles.tile_for(1, n, k, sum_fused=True) == split
    assert tiles.tile_for(16, n, k, sum_fused=True) is None  # cuBLAS where the pair says so
    assert tiles.tile_for(1, n, k) == one
    other = next(shape for shape in tiles.TILES if shape != (n, k))
    assert tiles.tile_for(1, *other, sum_fused=True) == tiles.TILES[other][0]


def test_a_gated_product_takes_its_own_tile() -> None:
    """`GATED_TILES` overrides `TILES` for the gated form (`linear_silu_mul`) only."""
    for (n, k), (one, _) in tiles.GATED_TILES.items():
        assert tiles.tile_for(1, n, k, gated=True) == one
        plain = tiles.TILES.get((n, k))
        assert tiles.tile_for(1, n, k) == (plain[0] if plain else None)


@pytest.mark.parametrize("shape", list(tiles.GATED_TILES))
def test_every_gated_tile_is_correct_at_its_shape_scaled_down(shape: tuple[int, int]) -> None:
    inter, k = 24, shape[1]  # 2 x 24 rows of [gate; up], fewer than a tile's multiple
    g = torch.Generator().manual_seed(k + 1)
    # Unit-sized products (weights scaled by 1/sqrt(K)): silu's rounding at large values
    # would swamp the comparison.
    w = (torch.randn((2 * inter, k), generator=g) / k**0.5).bfloat16().to(DEVICE)
    tile = tiles.GATED_TILES[shape][0]
    assert tile is not None
    x = torch.randn((1, k), generator=g).bfloat16().to(DEVICE)
    want = silu_and_mul_ref(linear_ref(x, w))
    # A few ulps through silu and the product, as in the gated test above.
    torch.testing.assert_close(linear_triton(x, w, tile, gated=True).float(), want.float(),
                               rtol=2**-5, atol=5e-2)


@pytest.mark.parametrize(("shape", "m", "tile"), [
    (shape, m, tile) for shape, pair in tiles.SUM_FUSED_TILES.items()
    for m, tile in zip((1, 5), pair, strict=True) if tile is not None])
def test_every_fused_sum_tile_is_correct_at_its_shape_scaled_down(shape: tuple[int, int],
                                                                  m: int, tile: Tile) -> None:
    """As below, for `SUM_FUSED_TILES`, in the form `linear_add_rms_norm` runs them."""
    from openinfer_kernels.gemm.triton import linear_add_rms_norm_triton
    from openinfer_kernels.norm.reference import fused_add_rms_norm_ref
    from openinfer_kernels.norm.triton import fused_add_rms_norm_triton

    n, k = 37, shape[1]
    g = torch.Generator().manual_seed(k + m)
    w = torch.randn((n, k), generator=g).bfloat16().to(DEVICE)
    x = torch.randn((m, k), generator=g).bfloat16().to(DEVICE)
    residual = torch.randn((m, n), generator=g).bfloat16().to(DEVICE)
    norm_w = torch.rand(n, generator=g).bfloat16().to(DEVICE)
    got = (linear_add_rms_norm_triton(x, w, tile, residual, norm_w, 1e-6) if tile.split_k > 1
           else fused_add_rms_norm_triton(linear_triton(x, w, tile), residual, norm_w, 1e-6))
    want = fused_add_rms_norm_ref(linear_ref(x, w), residual, norm_w, 1e-6)
    for a, b in zip(got, want, strict=True):  # as test_linear_add_rms_norm_is_...
        torch.testing.assert_close(a.float(), b.float(), rtol=2**-6, atol=0.125)


@pytest.mark.parametrize("shape", list(tiles.TILES))
def test_every_table_tile_is_correct_at_its_shape_scaled_down(shape: tuple[int, int]) -> None:
    """Each tile of the table at its own K and a column count it does not divide (the full N
    is too slow for the interpreter; on a GPU the benchmark checks the full shapes). In bf16,
    the dtype the tiles were chosen for: some would not fit shared memory in fp32."""
    n, k = 37, shape[1]
    g = torch.Generator().manual_seed(k)
    w = torch.randn((n, k), generator=g).bfloat16().to(DEVICE)
    for m, tile in zip((1, 5), tiles.TILES[shape], strict=True):
        if tile is None:  # cuBLAS at this batch size
            continue
        x = torch.randn((m, k), generator=g).bfloat16().to(DEVICE)
        torch.testing.assert_close(linear_triton(x, w, tile).float(),
                                   linear_ref(x, w).float(), **TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize(("m", "inter", "k"), [(1, 5, 7), (1, 40, 100), (3, 40, 100),
                                               (17, 33, 70)])
def test_gated_linear_is_silu_and_mul_of_the_product(m: int, inter: int, k: int, tile: str,
                                                     dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(m * 10_000 + inter * 100 + k)
    x = torch.randn((m, k), generator=g).to(dtype).to(DEVICE)
    w = torch.randn((2 * inter, k), generator=g).to(dtype).to(DEVICE)  # [gate; up]
    out = linear_triton(x, w, TILES[tile], gated=True)
    assert out.shape == (m, inter) and out.dtype == dtype
    want = silu_and_mul_ref(linear_ref(x, w))
    # The product's roundings to dtype may land one ulp apart from the reference's; through
    # silu and the product that is a few ulps of the output.
    tol = TOL[dtype] if dtype == torch.float32 else dict(rtol=2**-5, atol=5e-2)
    torch.testing.assert_close(out.float(), want.float(), **tol)


def test_gated_op_is_silu_and_mul_of_f_linear_on_cpu() -> None:
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn((3, 40), generator=g), torch.randn((48, 40), generator=g)
    assert torch.equal(openinfer_kernels.linear_silu_mul(x, w),
                       silu_and_mul_ref(torch.nn.functional.linear(x, w)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tile", ["n16-k32-split3", "n32-k64-split4"])
@pytest.mark.parametrize("m", [1, 3, 17])
def test_linear_add_rms_norm_is_the_linear_then_the_add_norm(m: int, tile: str,
                                                             dtype: torch.dtype) -> None:
    """The norm kernel sums the split-K shares itself: the same numbers as the linear (its own
    split sum, rounded) followed by fused_add_rms_norm, bit for bit."""
    from openinfer_kernels.gemm.triton import linear_add_rms_norm_triton
    from openinfer_kernels.norm.reference import fused_add_rms_norm_ref
    from openinfer_kernels.norm.triton import fused_add_rms_norm_triton

    g = torch.Generator().manual_seed(m)
    x = torch.randn((m, 100), generator=g).to(dtype).to(DEVICE)
    w = torch.randn((40, 100), generator=g).to(dtype).to(DEVICE)
    residual = torch.randn((m, 40), generator=g).to(dtype).to(DEVICE)
    norm_w = (1 + 0.3 * torch.randn(40, generator=g)).to(dtype).to(DEVICE)
    residual_before = residual.clone()
    normed, summed = linear_add_rms_norm_triton(x, w, TILES[tile], residual, norm_w, 1e-6)
    two_step = fused_add_rms_norm_triton(linear_triton(x, w, TILES[tile]), residual, norm_w, 1e-6)
    assert torch.equal(normed, two_step[0]) and torch.equal(summed, two_step[1])
    assert torch.equal(residual, residual_before)
    ref = fused_add_rms_norm_ref(linear_ref(x, w), residual, norm_w, 1e-6)
    # bf16: the product (|x| ~ 10 here) and the sum are each rounded once, up to 2^-8 of
    # ~16 apiece: 0.125 together, for sums near zero too.
    tol = TOL[dtype] if dtype == torch.float32 else dict(rtol=2**-6, atol=0.125)
    torch.testing.assert_close(summed.float(), ref[1].float(), **tol)


def test_linear_add_rms_norm_needs_a_split_tile() -> None:
    from openinfer_kernels.gemm.triton import linear_add_rms_norm_triton

    x, w = torch.zeros(1, 32, device=DEVICE), torch.zeros(16, 32, device=DEVICE)
    with pytest.raises(ValueError, match="split-K tile"):
        linear_add_rms_norm_triton(x, w, TILES["n16-k32"], torch.zeros(1, 16, device=DEVICE),
                                   torch.ones(16, device=DEVICE), 1e-6)


def test_the_dispatching_add_norm_op_on_cpu_is_the_composition() -> None:
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn((2, 24), generator=g), torch.randn((8, 24), generator=g)
    residual, norm_w = torch.randn((2, 8), generator=g), torch.rand(8, generator=g)
    got = openinfer_kernels.linear_add_rms_norm(x, w, residual, norm_w, 1e-6)
    want = openinfer_kernels.fused_add_rms_norm(openinfer_kernels.linear(x, w), residual, norm_w,
                                                1e-6)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="the dispatch picks Triton tiles on CUDA only")
def test_linear_add_rms_norm_on_cuda_runs_the_fused_sum_tile(monkeypatch):
    """Qwen3-4B's o_proj shape with a split tile in `SUM_FUSED_TILES`: the dispatching op is
    the fused form at that tile, bit for bit."""
    from openinfer_kernels.gemm import triton_linear_on
    from openinfer_kernels.gemm.triton import linear_add_rms_norm_triton

    if not triton_linear_on(0):
        pytest.skip("OPENINFER_LINEAR or the GPU keeps these shapes on cuBLAS")
    split = Tile(8, 512, 4)
    monkeypatch.setattr(tiles, "SUM_FUSED_TILES", {(2560, 4096): (split, split)})
    g = torch.Generator().manual_seed(7)
    w = (torch.randn((2560, 4096), generator=g) * 0.02).bfloat16().cuda()
    norm_w = torch.rand(2560, generator=g).bfloat16().cuda()
    for m in (1, 5):
        x = torch.randn((m, 4096), generator=g).bfloat16().cuda()
        residual = torch.randn((m, 2560), generator=g).bfloat16().cuda()
        got = openinfer_kernels.linear_add_rms_norm(x, w, residual, norm_w, 1e-6)
        want = linear_add_rms_norm_triton(x, w, split, residual, norm_w, 1e-6)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
