"""config.json in transformers' layout and in DeepSeek's give the same config; what the line
does not run is refused with the field named."""

from __future__ import annotations

import json

import pytest

from openinfer_core.errors import ModelConfigError
from openinfer_deepseek_v4.config import DeepseekV4Config

# DeepSeek's own keys for a 5-layer model (the last ratio is the MTP layer's), as in the
# published V4-Flash config.json
DEEPSEEK = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 5,
    "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
    "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024,
    "sliding_window": 128, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 6, "moe_intermediate_size": 2048, "num_hash_layers": 3,
    "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "norm_topk_prob": True,
    "swiglu_limit": 10.0, "rms_norm_eps": 1e-6, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
    "rope_theta": 10000, "compress_rope_theta": 160000, "max_position_embeddings": 1048576,
    "compress_ratios": [0, 0, 4, 128, 4, 0], "tie_word_embeddings": False,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
}


def test_deepseek_layout() -> None:
    c = DeepseekV4Config.from_dict(DEEPSEEK)
    assert c.compress_ratios == (0, 0, 4, 128, 4)  # the MTP layer's ratio dropped
    assert c.attention_kinds == ("window", "window", "csa", "hca", "csa")
    assert c.hash_layers == (True, True, True, False, False)
    assert (c.rope_head_dim, c.rope_theta, c.compress_rope_theta) == (64, 10000.0, 160000.0)
    assert c.yarn == {"factor": 16.0, "original_max_positions": 65536, "beta_fast": 32.0,
                      "beta_slow": 1.0}


def test_any_other_ratio_is_heavily_compressed_and_limit_0_is_none() -> None:
    """As DeepSeek's own code reads them: ratio 4 is CSA (overlap, indexer), any other positive
    ratio HCA; swiglu_limit 0 clamps nothing (inf for the kernels)."""
    c = DeepseekV4Config.from_dict(DEEPSEEK | {"compress_ratios": [0, 4, 16, 64, 8, 0],
                                               "swiglu_limit": 0})
    assert c.attention_kinds == ("window", "csa", "hca", "hca", "hca")
    assert c.compress_ratios == (0, 4, 16, 64, 8)
    assert c.swiglu_limit == float("inf")


def test_transformers_layout_reads_the_same() -> None:
    transformers = pytest.importorskip("transformers")
    written = transformers.DeepseekV4Config(**{k: v for k, v in DEEPSEEK.items()
                                                if k not in ("architectures", "model_type")})
    as_saved = json.loads(written.to_json_string())
    assert "compress_ratios" not in as_saved and "layer_types" in as_saved
    assert DeepseekV4Config.from_dict(as_saved) == DeepseekV4Config.from_dict(DEEPSEEK)


@pytest.mark.parametrize(("change", "message"), [
    ({"num_key_value_heads": 2}, "one shared KV head"),
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"compress_ratios": [0, 0, 4, -8, 4, 0]}, r"compress_ratios \[-8\]"),
    ({"compress_ratios": [0, 0]}, "2 layer types for 5 layers"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ({"hc_mult": "4"}, "'hc_mult' must be an integer"),
])
def test_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        DeepseekV4Config.from_dict({**DEEPSEEK, **change})
