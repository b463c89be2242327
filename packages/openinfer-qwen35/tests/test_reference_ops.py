"""The plain-torch ops against each other and against transformers' own torch code: the
chunked gated delta rule against the recurrence (odd lengths, chunks that do not divide
them), the batched form over state slots against one sequence at a time, and the carried
short convolution against a convolution over the whole sequence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from openinfer_qwen35.kernels.gated_delta_rule import (
    gated_delta_rule_chunk_ref,
    gated_delta_rule_recurrent_ref,
    gated_delta_rule_varlen_ref,
)
from openinfer_qwen35.kernels.short_conv import causal_conv1d_ref


def inputs(n: int, length: int, heads: int, value_heads: int, k: int, v: int, seed: int = 0
           ) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    return (r(n, length, heads, k), r(n, length, heads, k), r(n, length, value_heads, v),
            -torch.rand(n, length, value_heads, generator=gen),
            torch.rand(n, length, value_heads, generator=gen), r(n, value_heads, k, v))


@pytest.mark.parametrize("length, chunk", [(1, 64), (63, 16), (64, 64), (37, 8), (5, 64)])
def test_chunked_rule_matches_the_recurrence(length: int, chunk: int) -> None:
    q, k, v, g, beta, s0 = inputs(2, length, 2, 4, 12, 6)
    s_rec, s_chunk = s0.clone(), s0.clone()
    o_rec = gated_delta_rule_recurrent_ref(q, k, v, g, beta, s_rec)
    o_chunk = gated_delta_rule_chunk_ref(q, k, v, g, beta, s_chunk, chunk=chunk)
    torch.testing.assert_close(o_chunk, o_rec, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s_chunk, s_rec, atol=1e-5, rtol=1e-5)


def test_rule_matches_transformers() -> None:
    from checkpoints import torch_only_transformers  # noqa: F401  (hides fla on CPU)
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    q, k, v, g, beta, s0 = inputs(1, 19, 2, 4, 12, 6, seed=3)
    # Each key head serves consecutive value heads. Older transformers (the GPU image's)
    # take equal head counts only; their model repeats q and k before the call.
    qv, kv = (x.repeat_interleave(2, dim=2) for x in (q, k))
    expected, final = torch_recurrent_gated_delta_rule(
        qv, kv, v, g=g, beta=beta, initial_state=s0, output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    state = s0.clone()
    torch.testing.assert_close(gated_delta_rule_chunk_ref(q, k, v, g, beta, state, chunk=8),
                               expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, final, atol=1e-5, rtol=1e-5)


def test_varlen_rule_reads_and_writes_slots() -> None:
    q, k, v, g, beta, _ = inputs(1, 12, 2, 4, 8, 4, seed=5)
    states = torch.randn(5, 4, 8, 4)
    before = states.clone()
    qsl = torch.tensor([0, 7, 8, 12], dtype=torch.int32)
    slots, fresh = torch.tensor([3, 1, 4]), torch.tensor([True, False, False])
    out = gated_delta_rule_varlen_ref(q[0], k[0], v[0], g[0], beta[0], states, slots, fresh,
                                      qsl, decode=False)
    for b, (start, end) in enumerate([(0, 7), (7, 8), (8, 12)]):
        s = torch.zeros(1, 4, 8, 4) if fresh[b] else before[slots[b]][None].clone()
        part = slice(start, end)
        o = gated_delta_rule_recurrent_ref(q[:, part], k[:, part], v[:, part], g[:, part],
                                           beta[:, part], s)
        torch.testing.assert_close(out[part], o[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(states[slots[b]], s[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states[[0, 2]], before[[0, 2]], atol=0, rtol=0)


def test_carried_convolution_matches_whole_sequence() -> None:
    gen = torch.Generator().manual_seed(0)
    channels, taps, length = 6, 4, 11
    x = torch.randn(length, channels, generator=gen)
    weight = torch.randn(channels, taps, generator=gen)
    whole = F.silu(F.conv1d(x.t()[None], weight[:, None], padding=taps - 1,
                            groups=channels)[0, :, :length].t())
    state = torch.randn(3, channels, taps - 1, generator=gen)  # stale: the row is fresh
    pieces = []
    for i, (start, end) in enumerate([(0, 5), (5, 6), (6, 7), (7, 11)]):
        qsl = torch.tensor([0, end - start], dtype=torch.int32)
        pieces.append(causal_conv1d_ref(x[start:end], weight, state, torch.tensor([2]), qsl,
                                        torch.tensor([i == 0])))
    torch.testing.assert_close(torch.cat(pieces), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state[2], x[-(taps - 1):].t(), atol=0, rtol=0)


def test_mixed_graph_padding_touches_only_the_padding_slot() -> None:
    """A mixed CUDA graph's step: two real rows (slots 3 and 1, 5 tokens), then padding rows
    with no tokens on slot 0 and padding tokens past `query_start_loc[-1]`. The real tokens'
    outputs and slots are those of the step without padding; no other slot changes."""
    q, k, v, g, beta, _ = inputs(1, 8, 2, 4, 8, 4, seed=6)
    q, k, v, g, beta = q[0], k[0], v[0], g[0], beta[0]
    gen = torch.Generator().manual_seed(1)
    x, weight = torch.randn(8, 6, generator=gen), torch.randn(6, 4, generator=gen)
    states, convs = torch.randn(5, 4, 8, 4, generator=gen), torch.randn(5, 6, 3, generator=gen)
    real = (torch.tensor([3, 1]), torch.tensor([False, True]),
            torch.tensor([0, 4, 5], dtype=torch.int32))
    padded = (torch.tensor([3, 1, 0, 0]), torch.tensor([False, True, True, True]),
              torch.tensor([0, 4, 5, 5, 5], dtype=torch.int32))
    outs = []
    for (slots, fresh, qsl), n in ((real, 5), (padded, 8)):
        s, c = states.clone(), convs.clone()
        rule = gated_delta_rule_varlen_ref(q[:n], k[:n], v[:n], g[:n], beta[:n], s, slots,
                                           fresh, qsl, decode=False)
        conv = causal_conv1d_ref(x[:n], weight, c, slots, qsl, fresh)
        outs.append((rule[:5], conv[:5], s, c))
    (rule, conv, s, c), (rule_p, conv_p, s_p, c_p) = outs
    torch.testing.assert_close(rule_p, rule, atol=0, rtol=0)
    torch.testing.assert_close(conv_p, conv, atol=0, rtol=0)
    torch.testing.assert_close(s_p[1:], s[1:], atol=0, rtol=0)
    torch.testing.assert_close(c_p[1:], c[1:], atol=0, rtol=0)
    torch.testing.assert_close(s[[0, 2, 4]], states[[0, 2, 4]], atol=0, rtol=0)
    torch.testing.assert_close(c[[0, 2, 4]], convs[[0, 2, 4]], atol=0, rtol=0)
