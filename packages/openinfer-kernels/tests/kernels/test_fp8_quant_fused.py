"""The W8A8 product's activation quantization fused into the kernels that make the activation
(`fp8_linear/quant_fused.py`): RMSNorm, add + RMSNorm and silu(gate) * up, each giving the
same bits as the unfused pair of Triton kernels (the activation stored, then
`fp8_group_quant_triton`), and values near the references' activations. Under the
interpreter on CPU; `-m gpu` adds Qwen3-8B's widths at prompt sizes, compiled."""

from __future__ import annotations

import pytest
import torch

from openinfer_kernels.activation.triton import silu_and_mul_triton
from openinfer_kernels.fp8_linear import (
    add_rms_norm_group_quant_ref,
    rms_norm_group_quant_ref,
    silu_mul_group_quant_ref,
)
from openinfer_kernels.fp8_linear.quant_fused import (
    add_rms_norm_group_quant_triton,
    rms_norm_group_quant_triton,
    silu_mul_group_quant_triton,
)
from openinfer_kernels.fp8_linear.scaled_mm import _padded_rows
from openinfer_kernels.fp8_linear.w8a8_triton import fp8_group_quant_triton
from openinfer_kernels.norm.triton import fused_add_rms_norm_triton, rms_norm_triton

# The kernels run compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6
DTYPES = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                                 ids=["bf16", "fp16", "fp32"])
SHAPES = pytest.mark.parametrize(("m", "h"), [(1, 128), (5, 384), (37, 256)])


def rows(m: int, h: int, dtype: torch.dtype, seed: int, big: float = 300) -> torch.Tensor:
    """[M, H] on DEVICE, one row `big` times larger and one 128-group all zero where there is
    room."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((m, h), generator=g) * 2
    if m > 2:
        x[1] *= big
        x[2, :128] = 0
    return x.to(dtype).to(DEVICE)


def assert_same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]
                ) -> None:
    """The same e4m3 bits and fp32 scales, in `fp8_group_quant_triton`'s layout (the rows
    padded to 4 behind both, as cuBLASLt reads them)."""
    (q, scale), (want_q, want_scale) = got, want
    assert q.dtype == torch.float8_e4m3fn and q.shape == want_q.shape and q.is_contiguous()
    assert scale.shape == want_scale.shape and scale.stride() == want_scale.stride()
    assert _padded_rows(q, scale) == -(-q.shape[0] // 4) * 4
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scale, want_scale)


def assert_near_reference(got: tuple[torch.Tensor, torch.Tensor],
                          want: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Dequantized, within an e4m3 step (2^-3 relative) of the reference's, plus a bf16 ulp of
    the activation where the interpreter's truncating casts put it on the other side."""
    (q, scale), (want_q, want_scale) = got, want
    value = q.float().cpu() * scale.cpu().repeat_interleave(128, 1)
    want_value = want_q.float() * want_scale.repeat_interleave(128, 1)
    torch.testing.assert_close(value, want_value, rtol=2**-3, atol=2**-3 * want_scale.max().item())


@DTYPES
@SHAPES
def test_rms_norm_quant_is_the_unfused_pair(m: int, h: int, dtype: torch.dtype) -> None:
    x = rows(m, h, dtype, seed=m + h)
    weight = (1 + 0.3 * torch.randn(h, generator=torch.Generator().manual_seed(1))).to(dtype)
    weight = weight.to(DEVICE)
    got = rms_norm_group_quant_triton(x, weight, EPS)
    assert_same(got, fp8_group_quant_triton(rms_norm_triton(x, weight, EPS)))
    assert_near_reference(got, rms_norm_group_quant_ref(x.cpu(), weight.cpu(), EPS))


@DTYPES
@SHAPES
def test_add_rms_norm_quant_is_the_unfused_pair(m: int, h: int, dtype: torch.dtype) -> None:
    x = rows(m, h, dtype, seed=m * h)
    residual = rows(m, h, dtype, seed=m * h + 1)
    weight = (1 + 0.3 * torch.randn(h, generator=torch.Generator().manual_seed(2))).to(dtype)
    weight = weight.to(DEVICE)
    x_before, residual_before = x.clone(), residual.clone()
    q, scale, summed = add_rms_norm_group_quant_triton(x, residual, weight, EPS)
    normed, want_summed = fused_add_rms_norm_triton(x, residual, weight, EPS)
    assert_same((q, scale), fp8_group_quant_triton(normed))
    assert torch.equal(summed, want_summed) and summed.dtype == dtype
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)
    ref_q, ref_scale, ref_summed = add_rms_norm_group_quant_ref(x.cpu(), residual.cpu(),
                                                                weight.cpu(), EPS)
    assert_near_reference((q, scale), (ref_q, ref_scale))
    torch.testing.assert_close(summed.cpu(), ref_summed, rtol=2**-7, atol=0)


@DTYPES
@pytest.mark.parametrize(("m", "inter"), [(1, 128), (5, 384), (40, 256)])
def test_silu_mul_quant_is_the_unfused_pair(m: int, inter: int, dtype: torch.dtype) -> None:
    x = rows(m, 2 * inter, dtype, seed=m + inter, big=20)  # gate * up within fp16's range
    got = silu_mul_group_quant_triton(x)
    assert_same(got, fp8_group_quant_triton(silu_and_mul_triton(x)))
    assert_near_reference(got, silu_mul_group_quant_ref(x.cpu()))


def test_partial_groups_and_other_dtypes_are_refused() -> None:
    weight = torch.ones(200, device=DEVICE)
    with pytest.raises(ValueError, match="128-column groups"):
        rms_norm_group_quant_triton(torch.ones(2, 200, device=DEVICE).bfloat16(), weight, EPS)
    with pytest.raises(ValueError, match="128-column groups"):
        silu_mul_group_quant_triton(torch.ones(2, 2 * 200, device=DEVICE).bfloat16())
    with pytest.raises(ValueError, match="bf16, fp16 or fp32"):
        rms_norm_group_quant_triton(torch.ones(2, 256, device=DEVICE, dtype=torch.int32),
                                    weight[:1].expand(256), EPS)


def test_no_rows() -> None:
    x = torch.empty(0, 256, device=DEVICE, dtype=torch.bfloat16)
    q, scale = rms_norm_group_quant_triton(x, torch.ones(256, device=DEVICE), EPS)
    assert q.shape == (0, 256) and scale.shape == (0, 2)
    q, scale = silu_mul_group_quant_triton(torch.empty(0, 512, device=DEVICE).bfloat16())
    assert q.shape == (0, 256) and scale.shape == (0, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [64, 2048])
def test_qwen3_8b_widths(m: int) -> None:
    """Hidden 4096 and the MLP's 12288, compiled: the unfused pair's bits."""
    x, residual = rows(m, 4096, torch.bfloat16, 1), rows(m, 4096, torch.bfloat16, 2)
    weight = rows(1, 4096, torch.bfloat16, 3)[0]
    q, scale, _ = add_rms_norm_group_quant_triton(x, residual, weight, EPS)
    assert_same((q, scale), fp8_group_quant_triton(fused_add_rms_norm_triton(
        x, residual, weight, EPS)[0]))
    assert_same(rms_norm_group_quant_triton(x, weight, EPS),
                fp8_group_quant_triton(rms_norm_triton(x, weight, EPS)))
    gate_up = rows(m, 2 * 12288, torch.bfloat16, 4)
    assert_same(silu_mul_group_quant_triton(gate_up),
                fp8_group_quant_triton(silu_and_mul_triton(gate_up)))
