"""The built-in demo checkpoint: `openinfer serve` with no MODEL serves `demo_checkpoint()` (a
tiny Qwen3 with the real tokenizer, made on first use and cached), reached through the model
registry's metadata, never by importing this package by name. Finding it imports no torch (the
API process never loads it); writing it does (`random_weights`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openinfer_core.demo_folder import cached_demo, version_key
from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.tokenizer_files import write_qwen3_tokenizer

DEMO_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 151936,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "initializer_range": 0.25,
    "openinfer_demo": True,
}

GENERATION_CONFIG: dict[str, Any] = {
    "bos_token_id": 151643,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "do_sample": True,
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
}

DEMO_SEED = 0
# Wide weights: the logits spread out, so greedy output changes with the prompt.
DEMO_STD = 0.25

def write_demo_checkpoint(dest: Path) -> Path:
    """Write the demo checkpoint (config, random weights, generation config, the real Qwen3
    tokenizer) into the folder `dest`; returns `dest`."""
    import torch

    from openinfer_qwen3.random_weights import write_weights

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    _write_json(dest / "config.json", DEMO_CONFIG)
    _write_json(dest / "generation_config.json", GENERATION_CONFIG)
    write_weights(Qwen3Config.from_dict(DEMO_CONFIG), dest, std=DEMO_STD,
                  dtype=torch.float32, seed=DEMO_SEED)
    write_qwen3_tokenizer(dest)
    return dest


def demo_checkpoint() -> Path:
    """The demo checkpoint's folder, written on first use under the openinfer cache
    ($OPENINFER_CACHE_DIR, default ~/.cache/openinfer)."""
    # The source of this module and of the weight writer is part of the key, so changing how
    # the demo is made makes a new one.
    here = Path(__file__)
    key = version_key(here.read_bytes(), here.with_name("random_weights.py").read_bytes(),
                      json.dumps([DEMO_CONFIG, GENERATION_CONFIG, DEMO_SEED, DEMO_STD]))
    return cached_demo("demo-qwen3", key, write_demo_checkpoint)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
