"""The W8A8 block-FP8 linear: activations quantized per row and 128-column group
(`fp8_group_quant`) and multiplied as e4m3 by an e4m3 weight with 128 x 128 block scales
(`fp8_w8a8_linear`), against their references; its error against the bf16-activation linear
bounded by e4m3 rounding; and `fp8_dynamic_linear` choosing between the two linears by rows.
Shapes whose K and N no scale block divides, M from 1 up."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import openinfer_kernels.fp8_linear as fp8_linear
import openinfer_kernels.fp8_linear.dynamic as dynamic
from openinfer_kernels.fp8_linear import (
    fp8_block_linear_ref,
    fp8_group_quant_ref,
    fp8_w8a8_linear_ref,
)
from openinfer_kernels.fp8_linear.dynamic import FP8_LINEAR_ENV, dynamic_linear
from openinfer_kernels.fp8_linear.triton import fp8_block_linear_triton
from openinfer_kernels.fp8_linear.w8a8_triton import (
    W8a8Tile,
    fp8_group_quant_triton,
    fp8_w8a8_linear_triton,
)

# The kernels run compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = [(1, 150, 300), (3, 40, 70), (17, 200, 130), (70, 130, 256)]  # (M, N, K)
TILES = {
    "heuristic": None,
    "m16-n64": W8a8Tile(16, 64),
    "m32-n32-split3": W8a8Tile(32, 32, split_k=3),  # N tiles inside a scale block
    "m64-n256-group2": W8a8Tile(64, 256, group_m=2),  # two weight scale rows in a tile
}


def tol(out_dtype: torch.dtype, want: torch.Tensor) -> dict[str, float]:
    """Both operands are the same e4m3 values and fp32 scales on both sides: under the
    interpreter the only differences are the fp32 summation order (a few ulps of the largest
    partial sum: |terms| ~ 3 * 4 * 2^3, K <= 300) and, for bf16 output, its one rounding (the
    interpreter's cast may land one bf16 ulp off: 2^-7 relative). On a GPU the FP8 MMA keeps
    about 14 bits of its sum inside a 128-wide step (DeepSeek-V3's report): an error of a
    few 1e-4 of the partial sums, so the absolute tolerance follows the output's size."""
    rtol = 2**-7 if out_dtype == torch.bfloat16 else 1e-4
    atol = 2e-2 if out_dtype == torch.bfloat16 else 1e-3
    if DEVICE == "cuda":
        rtol, atol = max(rtol, 2e-3), max(atol, 4e-3 * want.abs().max().item())
    return dict(rtol=rtol, atol=atol)


def make(m: int, n: int, k: int, dtype: torch.dtype, seed: int, e8m0: bool = False
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x ([M, K], with one all-zero group and one large value where the shape has room), an
    e4m3 weight and its block scales (float32 like HF's `weight_scale_inv`, or E8M0 bytes
    2^-7 .. 2^3) on DEVICE."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((m, k), generator=g)
    if m > 1 and k > 128:
        x[1, :128] = 0.0
        x[0, 5] = 300.0
    w = (4 * torch.randn((n, k), generator=g)).to(torch.float8_e4m3fn)
    shape = (-(-n // 128), -(-k // 128))
    scale = (torch.randint(120, 131, shape, generator=g, dtype=torch.uint8) if e8m0
             else torch.exp2(torch.rand(shape, generator=g) * 10 - 7))
    return x.to(dtype).to(DEVICE), w.to(DEVICE), scale.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize(("m", "k"), [(1, 300), (3, 70), (17, 130), (40, 256)])
def test_group_quant_matches_reference(m: int, k: int, dtype: torch.dtype) -> None:
    """The same e4m3 bits and fp32 scales as the reference (both divide in IEEE fp32 and
    round to nearest even); the scales as the GEMM reads them, M-major."""
    x, _, _ = make(m, 8, k, dtype, seed=m + k)
    q, scale = fp8_group_quant_triton(x)
    want_q, want_scale = fp8_group_quant_ref(x.cpu())
    assert q.shape == (m, k) and q.dtype == torch.float8_e4m3fn and q.is_contiguous()
    assert scale.shape == (m, -(-k // 128)) and scale.stride(0) == 1
    assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scale.cpu(), want_scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_group_quant_reference_rounds_each_value_to_e4m3(dtype: torch.dtype) -> None:
    """The reference is the spec: per row and group (a partial last one over its own
    columns), scale = amax / 448 (an all-zero group: AMAX_FLOOR / 448, values 0), each value
    within half an e4m3 step of x / scale (2^-4 relative, 2^-10 below e4m3's normals), the
    group's largest exactly +-448."""
    x, _, _ = make(5, 8, 300, dtype, seed=7)
    q, scale = fp8_group_quant_ref(x.cpu())
    x = x.cpu().float()
    for g, cols in enumerate((slice(0, 128), slice(128, 256), slice(256, 300))):
        amax = x[:, cols].abs().amax(dim=1)
        assert torch.equal(scale[:, g], amax.clamp(min=1e-10) / 448)
        exact = x[:, cols] / scale[:, g, None]
        err = (q[:, cols].float() - exact).abs()
        assert bool((err <= torch.maximum(exact.abs() * 2**-4,
                                          torch.full_like(exact, 2**-10))).all())
        nonzero = amax > 0
        assert torch.equal(q[:, cols].float().abs().amax(dim=1)[nonzero],
                           torch.full((int(nonzero.sum()),), 448.0))
    assert bool((q[1, :128].float() == 0).all()) and scale[1, 0] == 1e-10 / 448


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("scales", ["float32", "e8m0"])
@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_w8a8_matches_reference(m: int, n: int, k: int, tile: str, scales: str,
                                out_dtype: torch.dtype) -> None:
    """The GEMM over the reference's quantized activations (scales [M, K/128] row-major)
    gives the reference's fp32 product of the same operands."""
    x, w, scale = make(m, n, k, torch.bfloat16, seed=m * 1000 + n + k, e8m0=scales == "e8m0")
    xq, x_scale = fp8_group_quant_ref(x.cpu())
    out = fp8_w8a8_linear_triton(xq.to(DEVICE), x_scale.to(DEVICE), w, scale, out_dtype,
                                 tile=TILES[tile])
    assert out.shape == (m, n) and out.dtype == out_dtype
    want = fp8_w8a8_linear_ref(xq, x_scale, w.cpu(), scale.cpu(), torch.float32)
    torch.testing.assert_close(out.float().cpu(), want, **tol(out_dtype, want))


def bound(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[M, N]: the most that quantizing x (per 128-column group, e4m3) can move x @ W^T, W
    the dequantized weight: sum over k of |W[n, k]| times the largest rounding error of
    x[m, k], half an e4m3 step (2^-4 |x|, or 2^-10 of its group's scale below the normals)."""
    x = x.cpu().float()
    _, x_scale = fp8_group_quant_ref(x)
    floor = x_scale.repeat_interleave(128, 1)[:, :x.shape[1]] * 2**-10
    err = torch.maximum(x.abs() * 2**-4, floor)
    dense = fp8_linear.dequant_fp8_blocks_ref(w.cpu(), scale.cpu(), dtype=torch.float32)
    return err @ dense.abs().t()


@pytest.mark.parametrize("scales", ["float32", "e8m0"])
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_w8a8_error_is_the_activation_rounding(m: int, n: int, k: int, scales: str) -> None:
    """Quantize + GEMM (the kernels end to end, bf16 out) against the bf16-activation linear
    in fp32: within the bound of e4m3 rounding of the activations plus the output's bf16
    rounding, and not equal (the activations were quantized)."""
    x, w, scale = make(m, n, k, torch.bfloat16, seed=m + n + k, e8m0=scales == "e8m0")
    out = fp8_w8a8_linear_triton(*fp8_group_quant_triton(x), w, scale)
    want = fp8_block_linear_ref(x.cpu(), w.cpu(), scale.cpu(), torch.float32)
    diff = (out.float().cpu() - want).abs()
    limit = bound(x, w, scale) + 2**-8 * want.abs() + 1e-3
    assert bool((diff <= limit).all()), (diff / limit).max()
    assert diff.max() > 0


def test_bad_operands_are_refused() -> None:
    x, w, scale = make(2, 40, 70, torch.bfloat16, seed=3)
    xq, x_scale = fp8_group_quant_triton(x)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_w8a8_linear_triton(x, x_scale, w, scale)
    with pytest.raises(ValueError, match=r"x_scale must be float32 \(2, 1\)"):
        fp8_w8a8_linear_triton(xq, x_scale.repeat(1, 2), w, scale)
    with pytest.raises(ValueError, match="E8M0 bytes or float32"):
        fp8_w8a8_linear_triton(xq, x_scale, w, scale.to(torch.bfloat16))
    with pytest.raises(ValueError, match="bf16, fp16 or fp32"):
        fp8_group_quant_triton(xq)


def test_no_rows() -> None:
    _, w, scale = make(1, 40, 70, torch.bfloat16, seed=4)
    x = torch.empty((0, 70), dtype=torch.bfloat16, device=DEVICE)
    xq, x_scale = fp8_group_quant_triton(x)
    assert xq.shape == (0, 70) and x_scale.shape == (0, 1)
    assert fp8_w8a8_linear_triton(xq, x_scale, w, scale).shape == (0, 40)


def spy_ops(calls: list[str]) -> Callable[..., torch.Tensor]:
    """The dynamic linear over the Triton kernels, each call noted."""

    def block(*args: object) -> torch.Tensor:
        calls.append("weight-only")
        return fp8_block_linear_triton(*args)  # type: ignore[arg-type]

    def quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append("quant")
        return fp8_group_quant_triton(x)

    def w8a8(*args: object) -> torch.Tensor:
        calls.append("w8a8")
        return fp8_w8a8_linear_triton(*args)  # type: ignore[arg-type]

    return dynamic_linear(block, quant, w8a8)


@pytest.mark.parametrize(("env", "rows", "path"), [
    (None, 3, "weight-only"), (None, 4, "w8a8"), ("auto", 17, "w8a8"),
    ("w8a8", 1, "w8a8"), ("weight-only", 17, "weight-only")])
def test_dynamic_linear_chooses_by_rows(monkeypatch: pytest.MonkeyPatch, env: str | None,
                                        rows: int, path: str) -> None:
    """From W8A8_MIN_ROWS rows (4 here) the activations are quantized, below it the result is
    `fp8_block_linear`'s, bit for bit; OPENINFER_FP8_LINEAR forces either path. The CPU op
    (the references) takes the same path."""
    monkeypatch.setattr(dynamic, "W8A8_MIN_ROWS", 4)
    if env is None:
        monkeypatch.delenv(FP8_LINEAR_ENV, raising=False)
    else:
        monkeypatch.setenv(FP8_LINEAR_ENV, env)
    x, w, scale = make(rows, 150, 300, torch.bfloat16, seed=rows)
    calls: list[str] = []
    out = spy_ops(calls)(x, w, scale)
    assert out.dtype == torch.bfloat16
    if path == "weight-only":
        assert calls == ["weight-only"]
        assert torch.equal(out, fp8_block_linear_triton(x, w, scale))
        want = fp8_block_linear_ref(x.cpu(), w.cpu(), scale.cpu())
    else:
        assert calls == ["quant", "w8a8"]
        want = fp8_w8a8_linear_ref(*fp8_group_quant_ref(x.cpu()), w.cpu(), scale.cpu())
    cpu = fp8_linear.fp8_dynamic_linear(x.cpu(), w.cpu(), scale.cpu())
    assert torch.equal(cpu, want)
    torch.testing.assert_close(out.float().cpu(), want.float(), **tol(torch.bfloat16, want))


def test_unknown_path_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FP8_LINEAR_ENV, "fp8")
    with pytest.raises(ValueError, match="OPENINFER_FP8_LINEAR must be one of auto, w8a8, "
                                         "weight-only, not 'fp8'"):
        dynamic.quantizes_activations(64)


# Qwen3-8B's linears, weight [N, K]: qkv, o_proj, gate_up, down.
QWEN3_8B = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [64, 333, 2048])
@pytest.mark.parametrize(("n", "k"), QWEN3_8B)
def test_qwen3_8b_shapes(m: int, n: int, k: int) -> None:
    """Compiled at full size, the references on the GPU too (torch's CUDA division and e4m3
    cast round as the kernel does): the same quantized bits, the reference's product, the
    same bits on every run."""
    x, w, scale = make(m, n, k, torch.bfloat16, seed=m + n + k)
    xq, x_scale = fp8_group_quant_triton(x)
    want_q, want_scale = fp8_group_quant_ref(x)
    assert torch.equal(xq.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(x_scale, want_scale)
    out = fp8_w8a8_linear_triton(xq, x_scale, w, scale)
    want = fp8_w8a8_linear_ref(want_q, want_scale, w, scale, torch.float32)
    torch.testing.assert_close(out.float(), want, **tol(torch.bfloat16, want))
    assert torch.equal(out, fp8_w8a8_linear_triton(xq, x_scale, w, scale))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [64, 333, 2048, 4099])
@pytest.mark.parametrize(("n", "k"), QWEN3_8B)
def test_cublas_product_at_qwen3_8b_shapes(m: int, n: int, k: int,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """On Hopper the dispatching `fp8_w8a8_linear` takes cuBLASLt's block-scaled product
    (`scaled_mm.py`: torch._scaled_mm, counted here) for float32-scaled whole blocks, row
    counts that no 4 divides included (their scales are stored padded): the reference's
    product, within the FP8 MMA's sums."""
    from openinfer_kernels.fp8_linear.scaled_mm import scaled_mm_applies

    calls = []
    scaled_mm = torch._scaled_mm

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return scaled_mm(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "_scaled_mm", counted)
    x, w, scale = make(m, n, k, torch.bfloat16, seed=m + n + k)
    xq, x_scale = fp8_group_quant_triton(x)
    assert scaled_mm_applies(xq, x_scale, w, scale, torch.bfloat16)
    out = fp8_linear.fp8_w8a8_linear(xq, x_scale, w, scale)
    assert len(calls) == 1
    want = fp8_w8a8_linear_ref(*fp8_group_quant_ref(x), w, scale, torch.float32)
    torch.testing.assert_close(out.float(), want, **tol(torch.bfloat16, want))


@pytest.mark.parametrize("m", [1, 5, 8])
def test_quantized_rows_are_padded_for_cublas(m: int) -> None:
    """cuBLASLt takes activation scales whose row stride is exactly the row count, 16-byte
    aligned: the quantizer allocates q and its scales for the rows rounded up to 4, and the
    cuBLASLt path runs on that padded view (`scaled_mm._padded_rows`); operands made
    elsewhere (no padding behind them) are refused."""
    from openinfer_kernels.fp8_linear.scaled_mm import _padded_rows

    x = torch.randn(m, 256, device=DEVICE).to(torch.bfloat16)
    xq, x_scale = fp8_group_quant_triton(x)
    padded = -(-m // 4) * 4
    assert _padded_rows(xq, x_scale) == padded
    assert xq.as_strided((padded, 256), xq.stride())[:m].data_ptr() == xq.data_ptr()
    want_q, want_scale = fp8_group_quant_ref(x)
    assert torch.equal(xq.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(x_scale, want_scale)
    assert _padded_rows(want_q, want_scale.t().contiguous().t()) == (m if m % 4 == 0 else 0)
