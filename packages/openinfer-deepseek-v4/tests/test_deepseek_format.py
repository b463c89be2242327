"""A checkpoint in DeepSeek's own names and formats (FP8 with 128 x 128 block scales, FP4
routed experts with per-32 scales, E8M0 scales) loads to the same weights as its dequantized
copy in transformers' names, and so gives the same logits. The quantizers
(dsv4_checkpoints.py) are the test's own arithmetic, independent of the loader's."""

from __future__ import annotations

import json

import torch
from dsv4_checkpoints import to_deepseek

from openinfer_core.weights.random_checkpoint import RandomCheckpoint
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.deepseek_names import weights_from_deepseek
from openinfer_deepseek_v4.dummy_weights import DummyTensors
from openinfer_deepseek_v4.hf_names import weights_from_transformers
from openinfer_deepseek_v4.quantized import Fp4Experts, Fp8Linear
from openinfer_deepseek_v4.reference import forward


def test_deepseek_format_loads_its_dequantized_copy(model, config) -> None:  # type: ignore[no-untyped-def]
    cfg = DeepseekV4Config.from_dict(json.loads(config.to_json_string()))
    native, same = to_deepseek(dict(model.state_dict()), cfg)
    assert native["layers.1.ffn.experts.0.w1.weight"].dtype == torch.int8
    assert native["layers.0.attn.wq_a.weight"].dtype == torch.float8_e4m3fn
    ours = weights_from_deepseek(native, cfg, dtype=torch.float32)
    want = weights_from_transformers(same, cfg)
    for got, expected in ((ours.layers[1].moe.gate_up, want.layers[1].moe.gate_up),
                          (ours.layers[2].moe.down, want.layers[2].moe.down),
                          (ours.layers[1].attention.q_b, want.layers[1].attention.q_b),
                          (ours.layers[1].attention.indexer.q_b,  # type: ignore[union-attr]
                           want.layers[1].attention.indexer.q_b)):  # type: ignore[union-attr]
        assert torch.equal(got, expected)
    # quantization changed the weights, so the check above is not of a copy with itself
    assert not torch.equal(want.layers[1].moe.gate_up, model.state_dict()[
        "model.layers.1.mlp.experts.gate_up_proj"])
    ids = torch.randint(0, config.vocab_size, (23,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(forward(ids, ours, cfg), forward(ids, want, cfg),
                                   rtol=0, atol=0)


def test_weights_kept_in_their_formats_give_the_dequantized_logits(model, config) -> None:  # type: ignore[no-untyped-def]
    """The GPU's path: FP8 linears and FP4 experts stay quantized and are dequantized inside
    the ops; the logits are those of the dequantized weights (fp32: up to summation order)."""
    cfg = DeepseekV4Config.from_dict(json.loads(config.to_json_string()))
    native, _ = to_deepseek(dict(model.state_dict()), cfg)
    kept = weights_from_deepseek(native, cfg, dtype=torch.float32, keep_quantized=True)
    plain = weights_from_deepseek(native, cfg, dtype=torch.float32)
    assert isinstance(kept.layers[1].attention.q_b, Fp8Linear)
    assert isinstance(kept.layers[1].attention.o_a, Fp8Linear)
    assert isinstance(kept.layers[1].moe.gate_up, Fp4Experts) and kept.layers[1].moe.down is None
    ids = torch.randint(0, config.vocab_size, (23,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(forward(ids, kept, cfg), forward(ids, plain, cfg),
                                   rtol=1e-5, atol=1e-5)


def test_dummy_weights_in_the_checkpoint_formats(config) -> None:  # type: ignore[no-untyped-def]
    """`--load-format dummy` on the GPU: FP8 and FP4 tensors with scales whose dequantized
    values have about the checkpoint's spread, and a forward that runs."""
    cfg = DeepseekV4Config.from_dict(json.loads(config.to_json_string()))
    tensors = DummyTensors(RandomCheckpoint("unused", std=0.02), cfg, torch.float32,
                           torch.device("cpu"), formats=True)
    w = weights_from_deepseek(tensors, cfg, dtype=torch.float32, keep_quantized=True)
    q_b = w.layers[0].attention.q_b
    experts = w.layers[2].moe.gate_up
    assert isinstance(q_b, Fp8Linear) and q_b.weight.dtype == torch.float8_e4m3fn
    assert isinstance(experts, Fp4Experts) and experts.gate_up.dtype == torch.uint8
    assert 0.015 < q_b.dequant(torch.float32).std().item() < 0.027
    assert 0.005 < experts.dequant_gate_up(torch.float32)[0].std().item() < 0.03
    logits = forward(torch.arange(9), w, cfg)
    assert logits.shape == (9, cfg.vocab_size) and bool(logits.isfinite().all())


def test_decode_weight_bytes_count_the_picked_experts_in_their_formats(model, config) -> None:  # type: ignore[no-untyped-def]
    """The benchmarks' floor: every held byte of the weights (FP8/FP4 where kept), less the
    embedding table but one row, less the routed experts a token does not pick, less the
    hash layers' id tables (a token reads k of its ids)."""
    import dataclasses

    from openinfer_deepseek_v4.model import decode_weight_bytes

    def flat(obj: object) -> list[torch.Tensor]:
        if isinstance(obj, torch.Tensor):
            return [obj]
        return ([t for item in obj for t in flat(item)] if isinstance(obj, (tuple, list))
                else [])

    cfg = DeepseekV4Config.from_dict(json.loads(config.to_json_string()))
    native, _ = to_deepseek(dict(model.state_dict()), cfg)
    for keep in (True, False):
        w = weights_from_deepseek(native, cfg, dtype=torch.float32, keep_quantized=keep)
        held = sum(t.numel() * t.element_size() for t in flat(dataclasses.astuple(w))
                   if t.dtype != torch.int64)
        moe = w.layers[1].moe
        experts = flat(dataclasses.astuple(moe.gate_up)) if keep else [moe.gate_up, moe.down]
        assert isinstance(moe.gate_up, Fp4Experts) == keep
        per_expert = sum(t[0].numel() * t.element_size() for t in experts if t is not None)
        row = w.embed[0].numel() * w.embed.element_size()
        want = (held - w.embed.numel() * w.embed.element_size() + row
                - cfg.num_layers * (cfg.num_experts - cfg.top_k) * per_expert)
        assert decode_weight_bytes(w, cfg.top_k) == want
