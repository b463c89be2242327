"""A demo checkpoint of the DeepSeek-V4 line: `openinfer serve --demo deepseek-v4` serves
`demo_checkpoint()`, a tiny DeepSeek-V4 in DeepSeek's own config and weight names (a window,
a CSA and an HCA layer, hash and routed MoE) with random weights and the real V4 tokenizer and
chat encoding. Made on first use and cached; found through the model registry's metadata."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openinfer_core.demo_folder import cached_demo, version_key
from openinfer_deepseek_v4.tokenizer_files import write_tokenizer_files

DEMO_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "vocab_size": 129280, "hidden_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
    "qk_rope_head_dim": 8, "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 32,
    "sliding_window": 16, "n_routed_experts": 8, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "moe_intermediate_size": 64, "num_hash_layers": 1,
    "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "norm_topk_prob": True,
    "swiglu_limit": 10.0, "rms_norm_eps": 1e-6, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "index_n_heads": 4, "index_head_dim": 16, "index_topk": 8,
    "rope_theta": 10000, "compress_rope_theta": 160000, "max_position_embeddings": 4096,
    # DeepSeek's layout gives the MTP layer a ratio too (the last; not loaded)
    "compress_ratios": [0, 4, 128, 0], "tie_word_embeddings": False,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "float32",
    "initializer_range": 0.25, "openinfer_demo": True,
}

GENERATION_CONFIG: dict[str, Any] = {"bos_token_id": 0, "eos_token_id": 1, "do_sample": True,
                                     "temperature": 1.0, "top_p": 1.0}

DEMO_SEED = 0


def write_demo_checkpoint(dest: Path) -> Path:
    """Write the demo checkpoint (config, random fp32 weights in DeepSeek's names, generation
    config, the V4 tokenizer) into `dest`; returns it."""
    import torch

    from openinfer_core.weights.random_checkpoint import RandomCheckpoint
    from openinfer_core.weights.safetensors_writer import write_safetensors
    from openinfer_deepseek_v4.config import DeepseekV4Config
    from openinfer_deepseek_v4.deepseek_names import deepseek_shapes
    from openinfer_deepseek_v4.dummy_weights import DummyTensors

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    _write_json(dest / "config.json", DEMO_CONFIG)
    _write_json(dest / "generation_config.json", GENERATION_CONFIG)
    cfg = DeepseekV4Config.from_dict(DEMO_CONFIG)
    tensors = DummyTensors(RandomCheckpoint(dest, std=DEMO_CONFIG["initializer_range"],
                                            seed=DEMO_SEED), cfg, torch.float32,
                           torch.device("cpu"))
    shapes = deepseek_shapes(cfg)
    dtypes = {n: torch.int64 if n.endswith("tid2eid") else torch.float32 for n in shapes}
    write_safetensors(dest, shapes, dtypes, tensors.__getitem__)
    write_tokenizer_files(dest)
    return dest


def demo_checkpoint() -> Path:
    """The demo checkpoint's folder, written on first use under the openinfer cache
    ($OPENINFER_CACHE_DIR, default ~/.cache/openinfer)."""
    here = Path(__file__)
    key = version_key(here.read_bytes(), here.with_name("dummy_weights.py").read_bytes(),
                      json.dumps([DEMO_CONFIG, GENERATION_CONFIG, DEMO_SEED]))
    return cached_demo("demo-deepseek-v4", key, write_demo_checkpoint)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
