"""Products fused so a step launches fewer kernels. Products of one input stacked by format
(`shared_input.py`): one product per stack gives each weight's product; the weights left
behind are views of the stacks (nothing held twice); FP8 weights stack only in whole scale
blocks of rows; an attention layer's products by name. The shared expert's FP8 [gate; up]
product with its clamped SwiGLU in one (`quantized.swiglu_linear`)."""

from __future__ import annotations

import pytest
import torch

from openinfer_deepseek_v4.quantized import Fp8Linear, linear
from openinfer_deepseek_v4.reference import AttentionWeights, CompressorWeights, IndexerWeights
from openinfer_deepseek_v4.shared_input import attention_products, shared_input


def _plain(rows: int, cols: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def _fp8(rows: int, cols: int, seed: int) -> Fp8Linear:
    g = torch.Generator().manual_seed(seed)
    codes = (torch.randn(rows, cols, generator=g) * 8).to(torch.float8_e4m3fn)
    scale = torch.randint(118, 126, (-(-rows // 128), -(-cols // 128)), generator=g,
                          dtype=torch.uint8)
    return Fp8Linear(codes, scale)


def _same_storage(view: torch.Tensor, stack: torch.Tensor) -> bool:
    return view.untyped_storage().data_ptr() == stack.untyped_storage().data_ptr()


def test_plain_products_stack_into_one_and_give_each_product() -> None:
    weights = {"a": _plain(24, 32, 1), "b": _plain(8, 32, 2), "c": _plain(40, 32, 3)}
    x = _plain(5, 32, 4)
    want = {name: linear(x, w) for name, w in weights.items()}
    products, views = shared_input(weights)
    assert products.launches == 1
    got = products(x)
    assert list(got) == ["a", "b", "c"]
    for name in weights:
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-6)
        assert torch.equal(views[name], weights[name])
        assert _same_storage(views[name], products.stacks[0][0])  # type: ignore[arg-type]
        assert views[name].is_contiguous()


def test_fp8_products_stack_in_whole_scale_blocks() -> None:
    weights = {"q_a": _fp8(256, 192, 5), "kv": _fp8(128, 192, 6), "odd": _fp8(64, 192, 7)}
    x = _plain(3, 192, 8).to(torch.bfloat16)
    want = {name: linear(x, w) for name, w in weights.items()}
    products, views = shared_input(weights)
    # 64 rows are half a scale block: that weight keeps a launch of its own.
    assert products.launches == 2
    assert [names for _, names, _ in products.stacks] == [("q_a", "kv"), ("odd",)]
    got = products(x)
    for name, w in weights.items():
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)
        view = views[name]
        assert isinstance(view, Fp8Linear)
        assert torch.equal(view.weight.view(torch.uint8), w.weight.view(torch.uint8))
        assert torch.equal(view.scale, w.scale)
    stack = products.stacks[0][0]
    assert isinstance(stack, Fp8Linear)
    assert _same_storage(views["kv"].weight, stack.weight)  # type: ignore[union-attr]
    assert _same_storage(views["kv"].scale, stack.scale)  # type: ignore[union-attr]


def test_formats_and_widths_do_not_mix() -> None:
    weights = {"fp8": _fp8(128, 64, 1), "plain": _plain(16, 64, 2),
               "wide": _plain(16, 96, 3), "half": _plain(16, 64, 4).half()}
    products, _ = shared_input(weights)
    assert products.launches == 4


def _compressor(width: int, hidden: int, seed: int) -> CompressorWeights:
    return CompressorWeights(_plain(width, hidden, seed), _plain(width, hidden, seed + 1),
                             _plain(4, width, seed + 2), _plain(1, width // 2, seed + 3)[0])


def test_a_csa_layer_runs_two_stacks_of_x_and_one_of_the_q_lora() -> None:
    hidden, rank, heads = 64, 32, 2
    w = AttentionWeights(
        q_a=_plain(rank, hidden, 1), q_a_norm=torch.ones(rank), q_b=_plain(heads * 16, rank, 2),
        kv=_plain(16, hidden, 3), kv_norm=torch.ones(16), o_a=_plain(8, 16, 4),
        o_b=_plain(hidden, 8, 5), sinks=torch.zeros(heads),
        compressor=_compressor(32, hidden, 10),
        indexer=IndexerWeights(_compressor(16, hidden, 20), _plain(4 * 8, rank, 6),
                               _plain(4, hidden, 7)))
    products, stacked = attention_products(w)
    assert products.of_x.launches == 1 and products.of_q.launches == 1  # all plain here
    assert products.of_x.stacks[0][1] == ("q_a", "kv", "compressor.kv", "compressor.gate",
                                          "indexer.kv", "indexer.gate", "indexer.weights")
    assert products.of_q.stacks[0][1] == ("q_b", "indexer.q_b")
    x = _plain(3, hidden, 9)
    of_x = products.of_x(x)
    assert stacked.indexer is not None and stacked.compressor is not None
    for name, weight in (("q_a", w.q_a), ("kv", w.kv), ("compressor.gate", w.compressor.gate),
                         ("indexer.weights", w.indexer.weights_proj)):  # type: ignore[union-attr]
        torch.testing.assert_close(of_x[name], linear(x, weight), rtol=1e-6, atol=1e-6)
    # The layer's weights are now the stacks' views, equal to what they were.
    assert torch.equal(stacked.indexer.compressor.kv, w.indexer.compressor.kv)  # type: ignore[union-attr]
    assert _same_storage(stacked.indexer.q_b, products.of_q.stacks[0][0])  # type: ignore[arg-type]
    assert stacked.o_b is w.o_b  # not stacked: the same tensor


@pytest.mark.parametrize("compressed", [False, True], ids=["window", "hca"])
def test_layers_without_an_indexer(compressed: bool) -> None:
    hidden, rank = 64, 32
    w = AttentionWeights(
        q_a=_plain(rank, hidden, 1), q_a_norm=torch.ones(rank), q_b=_plain(32, rank, 2),
        kv=_plain(16, hidden, 3), kv_norm=torch.ones(16), o_a=_plain(8, 16, 4),
        o_b=_plain(hidden, 8, 5), sinks=torch.zeros(2),
        compressor=_compressor(16, hidden, 10) if compressed else None, indexer=None)
    products, stacked = attention_products(w)
    names = products.of_x.stacks[0][1]
    assert names == (("q_a", "kv", "compressor.kv", "compressor.gate") if compressed
                     else ("q_a", "kv"))
    assert products.of_q.stacks[0][1] == ("q_b",)
    assert (stacked.compressor is None) == (not compressed)


def test_unstacked_each_product_is_a_launch_of_its_own() -> None:
    # OPENINFER_DSV4_STACK=0 (model.py): the A/B against separate products.
    weights = {"a": _plain(24, 32, 1), "b": _plain(8, 32, 2)}
    products, views = shared_input(weights, stack=False)
    assert products.launches == 2
    assert views["a"] is weights["a"] and views["b"] is weights["b"]
    x = _plain(2, 32, 3)
    assert torch.equal(products(x)["b"], linear(x, weights["b"]))


@pytest.mark.parametrize("limit", [10.0, float("inf")], ids=["clamped", "unclamped"])
def test_the_shared_experts_fp8_swiglu_is_the_unfused_one(limit: float) -> None:
    """`swiglu_linear` on an FP8 [gate; up] weight (the gated FP8 product, its clamp in the
    epilogue on the GPU) gives the unfused `swiglu_clamped(linear(...))` exactly (here through
    the references: the roundings are the same points)."""
    from openinfer_deepseek_v4.kernels.moe import swiglu_clamped_ref
    from openinfer_deepseek_v4.quantized import swiglu_linear

    w = _fp8(256, 128, 11)
    x = (4 * _plain(3, 128, 12)).to(torch.bfloat16)
    got = swiglu_linear(x, w, limit)
    want = swiglu_clamped_ref(linear(x, w), limit)
    assert torch.equal(got, want)
    if limit < float("inf"):
        assert not torch.equal(got, swiglu_clamped_ref(linear(x, w), float("inf")))
