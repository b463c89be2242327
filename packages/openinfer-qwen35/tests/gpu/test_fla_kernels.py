"""fla's gated delta rule (`kernels/gated_delta_rule/fla.py`) against the torch reference on
the GPU, over flattened batches with state slots: prompt chunks of odd lengths (chunk form)
and decode rows (fused recurrent). Run on the device with `-m gpu`."""

from __future__ import annotations

import pytest
import torch

from openinfer_qwen35.kernels.gated_delta_rule import gated_delta_rule_varlen_ref

pytestmark = pytest.mark.gpu

# bf16 inputs, fp32 states and accumulation: the outputs round to bf16 once.
TOL = {torch.float32: 2e-3, torch.bfloat16: 2e-2}


def case(lengths: list[int], dtype: torch.dtype, heads: int = 4, value_heads: int = 8,
         k: int = 64, v: int = 32) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    t = sum(lengths)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cuda").to(dtype)

    g = -torch.rand(t, value_heads, generator=gen, device="cuda")
    beta = torch.rand(t, value_heads, generator=gen, device="cuda").to(dtype)
    qsl = torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)
    return r(t, heads, k), r(t, heads, k), r(t, value_heads, v), g, beta, qsl


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths", [[63], [1, 70, 5], [128, 1, 1, 33]])
def test_chunk_matches_reference(lengths: list[int], dtype: torch.dtype) -> None:
    from openinfer_qwen35.kernels.gated_delta_rule.fla import (
        ChunkPlan,
        gated_delta_rule_varlen_fla,
    )

    q, k, v, g, beta, qsl = case(lengths, dtype)
    rows = len(lengths)
    states = torch.randn(rows + 2, 8, 64, 32, device="cuda")
    slots = torch.arange(rows, device="cuda") + 1
    fresh = torch.arange(rows, device="cuda") % 2 == 0
    ref_states = states.clone()
    want = gated_delta_rule_varlen_ref(q, k, v, g, beta, ref_states, slots, fresh, qsl,
                                       decode=False)
    # The engine's way: the step's chunk plan built from the host bounds.
    got = gated_delta_rule_varlen_fla(q, k, v, g, beta, states, slots, fresh, qsl,
                                      decode=False, plan=ChunkPlan.of(qsl, qsl.cpu()))
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(states, ref_states, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_matches_reference(dtype: torch.dtype) -> None:
    from openinfer_qwen35.kernels.gated_delta_rule.fla import gated_delta_rule_varlen_fla

    q, k, v, g, beta, qsl = case([1] * 5, dtype)
    states = torch.randn(8, 8, 64, 32, device="cuda")
    slots = torch.tensor([3, 1, 6, 2, 5], device="cuda")
    fresh = torch.tensor([False, True, False, False, True], device="cuda")
    ref_states = states.clone()
    want = gated_delta_rule_varlen_ref(q, k, v, g, beta, ref_states, slots, fresh, qsl,
                                       decode=True)
    got = gated_delta_rule_varlen_fla(q, k, v, g, beta, states, slots, fresh, qsl, decode=True)
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(states, ref_states, atol=TOL[dtype], rtol=TOL[dtype])
