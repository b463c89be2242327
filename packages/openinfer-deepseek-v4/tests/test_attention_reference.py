"""The whole-sequence attention sublayer (reference.py) against transformers'
DeepseekV4Attention, in fp32, for each attention kind, with prompts that slide the window and
fill several compressed entries (and, at ratio 4, more than the indexer keeps)."""

from __future__ import annotations

import json

import pytest
import torch

from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.reference import (
    AttentionWeights,
    CompressorWeights,
    IndexerWeights,
    attention,
)

tf = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")


def _compressor(m) -> CompressorWeights:  # type: ignore[no-untyped-def]
    return CompressorWeights(m.kv_proj.weight, m.gate_proj.weight, m.position_bias,
                             m.kv_norm.weight)


def _weights(m) -> AttentionWeights:  # type: ignore[no-untyped-def]
    c = m.compressor
    indexer = getattr(c, "indexer", None)
    return AttentionWeights(
        q_a=m.q_a_proj.weight, q_a_norm=m.q_a_norm.weight, q_b=m.q_b_proj.weight,
        kv=m.kv_proj.weight, kv_norm=m.kv_norm.weight, o_a=m.o_a_proj.weight,
        o_b=m.o_b_proj.weight, sinks=m.sinks, compressor=None if c is None else _compressor(c),
        indexer=None if indexer is None else IndexerWeights(
            _compressor(indexer), indexer.q_b_proj.weight, indexer.scorer.weights_proj.weight))


@pytest.mark.parametrize("layer", [0, 1, 2], ids=["window", "csa", "hca"])
@pytest.mark.parametrize("tokens", [5, 37])
def test_attention_matches_transformers(config, layer: int, tokens: int) -> None:  # type: ignore[no-untyped-def]
    module = tf.DeepseekV4Attention(config, layer).eval()
    g = torch.Generator().manual_seed(layer)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    x = torch.randn(1, tokens, config.hidden_size, generator=g)
    positions = torch.arange(tokens)[None]
    rope = tf.DeepseekV4RotaryEmbedding(config)
    embeddings = {kind: rope(x, positions, layer_type=kind) for kind in ("main", "compress")}
    distance = positions[0][:, None] - positions[0][None, :]
    mask = torch.zeros(tokens, tokens).masked_fill(
        (distance < 0) | (distance >= config.sliding_window), float("-inf"))[None, None]
    cfg = DeepseekV4Config.from_dict(json.loads(config.to_json_string()))
    with torch.no_grad():
        want, _ = module(x, embeddings, positions, mask)
        ours = attention(x[0], _weights(module), cfg, layer)
    torch.testing.assert_close(ours, want[0], rtol=1e-5, atol=1e-5)
