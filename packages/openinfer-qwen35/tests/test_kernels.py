"""The Triton kernels of our own against the torch references: the decode kernels
(`short_conv/decode_triton.py`, `gated_delta_rule/decode_triton.py`), the gated output norm
(`gated_norm.py`), the attention prologue (`attention_prologue.py`) and the attention's output
gate (`output_gate.py`):
under the Triton interpreter on CPU at small shapes, compiled at Qwen3.5-4B's head shapes on
the GPU (`-m gpu`). Rows read and write state slots in place, some starting afresh, one on
the padding slot, with the others' slots left as they were."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from openinfer_kernels import rope_cos_sin
from openinfer_qwen35.kernels.attention_prologue import (
    qk_norm_partial_rope_ref,
    qk_norm_partial_rope_triton,
)
from openinfer_qwen35.kernels.gated_delta_rule import gated_delta_rule_varlen_ref
from openinfer_qwen35.kernels.gated_delta_rule.decode_triton import gated_delta_rule_decode
from openinfer_qwen35.kernels.gated_norm import gated_rms_norm_ref, gated_rms_norm_triton
from openinfer_qwen35.kernels.output_gate import output_gate_ref, output_gate_triton
from openinfer_qwen35.kernels.short_conv import causal_conv1d_ref
from openinfer_qwen35.kernels.short_conv.decode_triton import causal_conv1d_decode

# (key heads, value heads, key dim, value dim)
SMALL = (2, 4, 16, 8)
QWEN35_4B = (16, 32, 128, 128)
# CPU tensors run under Triton's interpreter (the CPU suite sets it); on the GPU machine,
# which runs compiled kernels only, the compiled case stands in for them.
CASES = [pytest.param("cpu", SMALL, id="interpreted", marks=pytest.mark.skipif(
            torch.cuda.is_available(), reason="the GPU machine runs the compiled case")),
         pytest.param("cuda", QWEN35_4B, id="4b-compiled", marks=pytest.mark.gpu)]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def rows_and_slots(device: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    slots = torch.tensor([3, 1, 6, 0, 5], device=device)
    fresh = torch.tensor([False, True, False, False, True], device=device)
    return slots, fresh, 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device, shape", CASES)
def test_conv_decode_matches_reference(device: str, shape: tuple[int, ...],
                                       dtype: torch.dtype) -> None:
    hk, hv, kd, vd = shape
    channels, taps = 2 * hk * kd + hv * vd, 4
    gen = torch.Generator(device=device).manual_seed(0)
    slots, fresh, num_slots = rows_and_slots(device)
    rows = slots.shape[0]
    # A strided view, as the layer's in-projection output is.
    wide = torch.randn(rows, channels + 24, generator=gen, device=device).to(dtype)
    x = wide[:, 7:7 + channels]
    weight = torch.randn(channels, taps, generator=gen, device=device).to(dtype)
    state = torch.randn(num_slots, channels, taps - 1, generator=gen, device=device).to(dtype)
    want_state = state.clone()
    qsl = torch.arange(rows + 1, device=device, dtype=torch.int32)
    want = causal_conv1d_ref(x, weight, want_state, slots, qsl, fresh)
    got = causal_conv1d_decode(x, weight, state, slots, fresh)
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(state, want_state, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device, shape", CASES)
def test_rule_decode_matches_reference(device: str, shape: tuple[int, ...],
                                       dtype: torch.dtype) -> None:
    hk, hv, kd, vd = shape
    gen = torch.Generator(device=device).manual_seed(1)
    slots, fresh, num_slots = rows_and_slots(device)
    rows = slots.shape[0]

    def r(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device)

    qkv = r(rows, 2 * hk * kd + hv * vd).to(dtype)
    # a and b: columns of one projection output, as in the layer.
    ab = r(rows, 2 * hv + 3).to(dtype)
    b, a = ab[:, 1:1 + hv], ab[:, 1 + hv:1 + 2 * hv]
    a_neg = -torch.rand(hv, generator=gen, device=device) * 4
    dt_bias = r(hv).to(dtype)
    state = r(num_slots, hv, kd, vd)
    want_state = state.clone()
    q, k, v = qkv.split([hk * kd, hk * kd, hv * vd], dim=-1)
    beta = b.sigmoid()
    g = a_neg * F.softplus(a.float() + dt_bias)
    qsl = torch.arange(rows + 1, device=device, dtype=torch.int32)
    want = gated_delta_rule_varlen_ref(
        q.reshape(rows, hk, kd), k.reshape(rows, hk, kd), v.reshape(rows, hv, vd), g, beta,
        want_state, slots, fresh, qsl, decode=True)
    got = gated_delta_rule_decode(qkv, a, b, a_neg, dt_bias, state, slots, fresh, hk)
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    # beta is rounded to bf16 as torch rounds it; Triton's interpreter rounds casts to bf16
    # toward zero (one bf16 ulp of beta off), compiled kernels to nearest even.
    state_tol = 1e-2 if device == "cpu" and dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(state, want_state, atol=state_tol, rtol=state_tol)
    # Slots 2, 4 and 7 belong to no row and are left exactly as they were.
    untouched = [2, 4, 7]
    assert torch.equal(state[untouched], want_state[untouched])


@pytest.mark.parametrize("dtype, weight_dtype", [(torch.float32, torch.float32),
                                                 (torch.bfloat16, torch.bfloat16),
                                                 (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("device, shape", CASES)
def test_gated_norm_matches_reference(device: str, shape: tuple[int, ...], dtype: torch.dtype,
                                      weight_dtype: torch.dtype) -> None:
    _, hv, _, vd = shape
    gen = torch.Generator(device=device).manual_seed(2)
    tokens = 6
    x = torch.randn(tokens, hv, vd, generator=gen, device=device).to(dtype)
    zs = torch.randn(tokens, hv * vd + 5, generator=gen, device=device).to(dtype)
    z = zs[:, 5:].reshape(tokens, hv, vd)
    weight = (1 + 0.1 * torch.randn(vd, generator=gen, device=device)).to(weight_dtype)
    want = gated_rms_norm_ref(x, z, weight, 1e-6)
    got = gated_rms_norm_triton(x, z, weight, 1e-6)
    assert got.dtype == want.dtype
    # One bf16 rounding step apart at most.
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device, width", [
    pytest.param("cpu", 1100, id="interpreted", marks=CASES[0].marks),  # past one block
    pytest.param("cuda", 4096, id="4b-compiled", marks=pytest.mark.gpu)])
def test_output_gate_matches_reference(device: str, width: int, dtype: torch.dtype) -> None:
    gen = torch.Generator(device=device).manual_seed(4)
    tokens = 5
    x = torch.randn(tokens, width, generator=gen, device=device).to(dtype)
    # The gate as the projection leaves it: the last part of each row of a wider output.
    projected = torch.randn(tokens, width + 96, generator=gen, device=device).to(dtype)
    gate = projected[:, 96:]
    want = output_gate_ref(x, gate)
    got = output_gate_triton(x, gate)
    assert got.dtype == want.dtype and got.shape == want.shape
    # torch rounds the sigmoid to the dtype, then the product: one rounding step apart at most
    # (the interpreter truncates where the GPU rounds).
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    with pytest.raises(ValueError, match="dense"):  # channels strided: refused
        output_gate_triton(x, torch.randn(width, tokens, device=device).to(dtype).t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device, heads, kv_heads, dim, rotary", [
    pytest.param("cpu", 4, 2, 32, 8, id="interpreted", marks=CASES[0].marks),
    pytest.param("cuda", 16, 4, 256, 64, id="4b-compiled", marks=pytest.mark.gpu)])
def test_attention_prologue_matches_reference(device: str, heads: int, kv_heads: int, dim: int,
                                              rotary: int, dtype: torch.dtype) -> None:
    gen = torch.Generator(device=device).manual_seed(3)
    tokens = 5
    # q, k, v, gate: column blocks of one projection output, as in the layer.
    proj = torch.randn(tokens, (2 * heads + 2 * kv_heads) * dim, generator=gen,
                       device=device).to(dtype)
    q, k, v, _ = proj.split([heads * dim, kv_heads * dim, kv_heads * dim, heads * dim], -1)
    q, k, v = (x.reshape(tokens, -1, dim) for x in (q, k, v))
    q_weight = 1 + 0.1 * torch.randn(dim, generator=gen, device=device)
    k_weight = 1 + 0.1 * torch.randn(dim, generator=gen, device=device)
    cos_sin = rope_cos_sin(64, rotary, 1e7, device)
    positions = torch.tensor([0, 3, 17, 40, 63], device=device)
    want = qk_norm_partial_rope_ref(q, k, v, q_weight, k_weight, 1e-6, positions, cos_sin)
    got = qk_norm_partial_rope_triton(q, k, v, q_weight, k_weight, 1e-6, positions, cos_sin)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.is_contiguous()
        torch.testing.assert_close(g.float(), w.float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(got[2], want[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device, channels", [
    pytest.param("cpu", 40, id="interpreted", marks=CASES[0].marks),
    pytest.param("cuda", 8192, id="4b-compiled", marks=pytest.mark.gpu)])
def test_conv_prompt_rows_match_reference(device: str, channels: int,
                                          dtype: torch.dtype) -> None:
    """Rows of 37 (more than one token block), 1, 0 and 2 tokens (shorter than the window),
    on slots some fresh, then padding tokens past the last row."""
    from openinfer_qwen35.kernels.short_conv.prefill_triton import causal_conv1d_triton

    gen = torch.Generator(device=device).manual_seed(4)
    lengths, taps = [37, 1, 0, 2], 4
    slots = torch.tensor([3, 1, 6, 2], device=device)
    fresh = torch.tensor([False, True, False, False], device=device)
    total = sum(lengths) + 3
    wide = torch.randn(total, channels + 10, generator=gen, device=device).to(dtype)
    x = wide[:, 5:5 + channels]
    weight = torch.randn(channels, taps, generator=gen, device=device).to(dtype)
    state = torch.randn(8, channels, taps - 1, generator=gen, device=device).to(dtype)
    want_state = state.clone()
    qsl = torch.tensor([0, *lengths], device=device).cumsum(0).to(torch.int32)
    want = causal_conv1d_ref(x, weight, want_state, slots, qsl, fresh)
    got = causal_conv1d_triton(x, weight, state, slots, qsl, fresh, max(lengths))
    real = int(qsl[-1])
    torch.testing.assert_close(got[:real].float(), want[:real].float(), atol=TOL[dtype],
                               rtol=TOL[dtype])
    assert not got[real:].any()
    torch.testing.assert_close(state, want_state, atol=0, rtol=0)
