"""`openinfer serve --demo qwen3.5`: a tiny Qwen3.5 (linear and full-attention layers) with
random weights and Qwen3's tokenizer and chat template, made on first use and cached. Finding
it imports no torch; writing it does (`random_weights`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openinfer_core.demo_folder import cached_demo, version_key

DEMO_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                    "full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
    # Qwen3's tokenizer (151,643 ranks + specials) fits in it.
    "vocab_size": 151936, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0,
                        "partial_rotary_factor": 0.25},
    "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "float32",
    "bos_token_id": 151643, "eos_token_id": 151645, "initializer_range": 0.25,
    "openinfer_demo": True,
}
DEMO_SEED = 0
DEMO_STD = 0.25  # wide weights: greedy output changes with the prompt


def write_demo_checkpoint(dest: Path) -> Path:
    import torch

    from openinfer_qwen3.demo import GENERATION_CONFIG
    from openinfer_qwen3.tokenizer_files import write_qwen3_tokenizer
    from openinfer_qwen35.config import Qwen35Config
    from openinfer_qwen35.random_weights import write_weights

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(DEMO_CONFIG, indent=2) + "\n")
    (dest / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    write_weights(Qwen35Config.from_dict(DEMO_CONFIG), dest, std=DEMO_STD, dtype=torch.float32,
                  seed=DEMO_SEED)
    write_qwen3_tokenizer(dest)
    return dest


def demo_checkpoint() -> Path:
    """The demo checkpoint's folder under the openinfer cache."""
    here = Path(__file__)
    key = version_key(here.read_bytes(), here.with_name("random_weights.py").read_bytes(),
                      json.dumps([DEMO_CONFIG, DEMO_SEED, DEMO_STD]))
    return cached_demo("demo-qwen35", key, write_demo_checkpoint)
