"""`lm_head_logits`: fp32 logits; on CUDA from bf16 inputs without a bf16 rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from openinfer_kernels import lm_head_logits
from openinfer_kernels.lm_head import lm_head_logits_ref


def test_reference_is_the_linear_in_fp32() -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 16, generator=g), torch.randn(40, 16, generator=g)
    out = lm_head_logits(x, w)
    assert out.dtype == torch.float32 and out.shape == (3, 40)
    assert torch.equal(out, F.linear(x, w))
    bf16 = lm_head_logits_ref(x.bfloat16(), w.bfloat16())
    assert bf16.dtype == torch.float32 and torch.equal(bf16, bf16.bfloat16().float())


@pytest.mark.gpu
def test_cuda_bf16_logits_keep_fp32_precision() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 2560, generator=g).bfloat16().cuda()
    w = (torch.randn(151936, 2560, generator=g) * 0.05).bfloat16().cuda()
    out = lm_head_logits(x, w)
    exact = x.double() @ w.double().t()
    assert out.dtype == torch.float32 and out.shape == (5, 151936)
    # fp32 accumulation of a 2560-term dot: ~1e-5 relative; a bf16 rounding would be 4e-3.
    torch.testing.assert_close(out.double(), exact, rtol=1e-4, atol=1e-4)
    assert (out != out.bfloat16().float()).float().mean() > 0.9  # not rounded to bf16


def test_reference_writes_into_out() -> None:
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 16, generator=g), torch.randn(40, 16, generator=g)
    buffer = torch.full((5, 40), float("nan"))
    out = lm_head_logits(x, w, buffer[:3])
    assert out.data_ptr() == buffer.data_ptr()
    assert torch.equal(buffer[:3], F.linear(x, w)) and buffer[3:].isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 7, 24])  # the Triton GEMV, its 16-row tile, cuBLAS
def test_cuda_logits_into_out_equal_a_new_tensor(rows: int) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(rows, 2560, generator=g).bfloat16().cuda()
    w = (torch.randn(151936, 2560, generator=g) * 0.05).bfloat16().cuda()
    buffer = torch.full((32, 151936), float("nan"), device="cuda")
    out = lm_head_logits(x, w, buffer[:rows])
    assert out.data_ptr() == buffer.data_ptr() and out.shape == (rows, 151936)
    assert torch.equal(out, lm_head_logits(x, w)) and buffer[rows:].isnan().all()
