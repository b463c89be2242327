"""Published Qwen3.5 configs (shapes only), for `--load-format dummy` benchmarks and GPU checks
without the hub: `write_config_folder("Qwen3.5-4B", dest)` writes a folder that `openinfer
serve dest --load-format dummy` serves at the real model's shapes (its language model; the
config is the published `Qwen3_5ForConditionalGeneration` form). The tokenizer written is
Qwen3's (Qwen3.5's own, 248k entries, is not bundled): token ids stay inside the vocabulary.
`reduced_depth(name, layers)` keeps the first `layers` layers, for golden gates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_LAYERS_4B = ["linear_attention", "linear_attention", "linear_attention",
              "full_attention"] * 8

_TEXT_4B: dict[str, Any] = {
    "model_type": "qwen3_5_text", "attention_bias": False, "attention_dropout": 0.0,
    "attn_output_gate": True, "dtype": "bfloat16", "eos_token_id": 248044,
    "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2560,
    "initializer_range": 0.02, "intermediate_size": 9216, "layer_types": _LAYERS_4B,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "num_attention_heads": 16, "num_hidden_layers": 32,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-6,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10],
                        "rope_type": "default", "rope_theta": 10_000_000,
                        "partial_rotary_factor": 0.25},
    "tie_word_embeddings": True, "vocab_size": 248320,
}

QWEN35_SHAPES: dict[str, dict[str, Any]] = {
    "Qwen3.5-4B": {
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
        "vision_end_token_id": 248054, "tie_word_embeddings": True, "text_config": _TEXT_4B,
        "vision_config": {"model_type": "qwen3_5", "depth": 24, "hidden_size": 1024,
                          "intermediate_size": 4096, "num_heads": 16, "out_hidden_size": 2560,
                          "patch_size": 16, "spatial_merge_size": 2,
                          "temporal_patch_size": 2},
    },
}


def reduced_depth(name: str, layers: int) -> dict[str, Any]:
    """`name`'s config with its first `layers` layers only."""
    config = json.loads(json.dumps(QWEN35_SHAPES[name]))
    text = config.get("text_config", config)
    text["num_hidden_layers"] = layers
    text["layer_types"] = text["layer_types"][:layers]
    return dict(config)


def write_config_folder(name: str, dest: Path, *, layers: int | None = None) -> Path:
    """config.json, generation_config.json and a tokenizer for model `name`."""
    from openinfer_qwen3.demo import GENERATION_CONFIG
    from openinfer_qwen3.tokenizer_files import write_qwen3_tokenizer

    if name not in QWEN35_SHAPES:
        raise KeyError(f"unknown Qwen3.5 size {name!r}; known: {', '.join(QWEN35_SHAPES)}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    config = QWEN35_SHAPES[name] if layers is None else reduced_depth(name, layers)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (dest / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    write_qwen3_tokenizer(dest)
    return dest
