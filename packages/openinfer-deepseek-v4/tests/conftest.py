"""A tiny transformers DeepseekV4Config with one layer of each attention kind (window only,
CSA at ratio 4, HCA at ratio 8), a hash MoE layer first, YaRN on the compressed layers; and a
DeepseekV4ForCausalLM of it with random weights."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def config():  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    return transformers.DeepseekV4Config(
        vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, head_dim=16,
        q_lora_rank=8, o_groups=2, o_lora_rank=8, n_routed_experts=8, num_experts_per_tok=3,
        moe_intermediate_size=32, swiglu_limit=1.5, index_n_heads=2, index_head_dim=16,
        index_topk=4, sliding_window=8, hc_sinkhorn_iters=20,
        layer_types=["sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe"],
        rope_scaling={"type": "yarn", "factor": 16, "beta_fast": 32,
                      "original_max_position_embeddings": 65536, "beta_slow": 1},
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8})


@pytest.fixture(scope="module")
def model(config):  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    model = transformers.DeepseekV4ForCausalLM(config).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if "hc" in name else 0.2))
        for layer in model.model.layers:
            gate = layer.mlp.gate
            if hasattr(gate, "tid2eid"):
                gate.tid2eid.copy_(torch.stack([torch.randperm(8, generator=g)[:3]
                                                for _ in range(config.vocab_size)]))
            else:
                gate.e_score_correction_bias.copy_(torch.randn(8, generator=g) * 0.1)
    return model
