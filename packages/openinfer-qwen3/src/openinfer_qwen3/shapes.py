"""The published Qwen3 configs (shapes only), for `--load-format dummy` benchmarks and GPU
checks on machines without the hub: `write_config_folder("Qwen3-8B", dest)` writes a folder
that `openinfer serve dest --load-format dummy` serves at the real model's shapes; with
`fp8=True`, Qwen3-*-FP8's config (its `quantization_config`: FP8 linears, dummy ones too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openinfer_qwen3.demo import GENERATION_CONFIG
from openinfer_qwen3.tokenizer_files import write_qwen3_tokenizer

_COMMON: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 40960,
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 151936,
}

QWEN3_SHAPES: dict[str, dict[str, Any]] = {
    "Qwen3-0.6B": {**_COMMON, "hidden_size": 1024, "intermediate_size": 3072,
                   "num_attention_heads": 16, "num_hidden_layers": 28,
                   "tie_word_embeddings": True},
    "Qwen3-4B": {**_COMMON, "hidden_size": 2560, "intermediate_size": 9728,
                 "tie_word_embeddings": True},
    "Qwen3-8B": {**_COMMON, "hidden_size": 4096, "intermediate_size": 12288,
                 "tie_word_embeddings": False},
    "Qwen3-32B": {**_COMMON, "hidden_size": 5120, "intermediate_size": 25600,
                  "num_attention_heads": 64, "num_hidden_layers": 64,
                  "tie_word_embeddings": False},
}

# The quantization_config Qwen publishes with Qwen3-*-FP8.
FP8_QUANTIZATION: dict[str, Any] = {
    "activation_scheme": "dynamic", "fmt": "e4m3", "modules_to_not_convert": ["lm_head"],
    "quant_method": "fp8", "weight_block_size": [128, 128],
}


def write_config_folder(name: str, dest: Path, *, fp8: bool = False) -> Path:
    """config.json, generation_config.json and the real Qwen3 tokenizer for model `name`
    (`fp8`: its FP8 release's config)."""
    if name not in QWEN3_SHAPES:
        raise KeyError(f"unknown Qwen3 size {name!r}; known: {', '.join(QWEN3_SHAPES)}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    config = dict(QWEN3_SHAPES[name], quantization_config=FP8_QUANTIZATION) if fp8 else (
        QWEN3_SHAPES[name])
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (dest / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    write_qwen3_tokenizer(dest)
    return dest
