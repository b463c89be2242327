"""Random-weight Qwen3 safetensors at a config's real shapes (written by openinfer-core's
`write_safetensors`, without transformers): the demo checkpoint's weights, and full-size
checkpoints for the GPU golden gate (transformers and openinfer read the same files)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from openinfer_core.errors import ModelConfigError
from openinfer_core.model_config import read_model_config
from openinfer_core.weights.safetensors_writer import write_safetensors
from openinfer_qwen3.config import Qwen3Config

log = logging.getLogger("openinfer.qwen3")

MAX_SHARD_BYTES = 2 << 30  # a module setting, so tests can shard small checkpoints

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def tensor_shapes(cfg: Qwen3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of a HuggingFace Qwen3ForCausalLM checkpoint, by name, in file order."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        attn = p + "self_attn."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[attn + "q_proj.weight"] = (cfg.q_size, h)
        shapes[attn + "k_proj.weight"] = (cfg.kv_size, h)
        shapes[attn + "v_proj.weight"] = (cfg.kv_size, h)
        if cfg.attention_bias:
            shapes[attn + "q_proj.bias"] = (cfg.q_size,)
            shapes[attn + "k_proj.bias"] = (cfg.kv_size,)
            shapes[attn + "v_proj.bias"] = (cfg.kv_size,)
        shapes[attn + "q_norm.weight"] = (d,)
        shapes[attn + "k_norm.weight"] = (d,)
        shapes[attn + "o_proj.weight"] = (h, cfg.q_size)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (i, h)
        shapes[p + "mlp.up_proj.weight"] = (i, h)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
    shapes["model.norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


def write_weights(cfg: Qwen3Config, dest: Path, *, std: float, dtype: torch.dtype,
                  seed: int = 0) -> None:
    """Random safetensors for `cfg` in `dest`: one file, or shards with an index past
    `MAX_SHARD_BYTES`. Norm weights are near 1, everything else normal with `std`; the same
    seed gives the same tensors on every machine (one CPU generator, drawn in file order)."""
    shapes = tensor_shapes(cfg)
    gen = torch.Generator().manual_seed(seed)

    def make(name: str) -> torch.Tensor:
        values = torch.randn(shapes[name], generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            return 1.0 + 0.1 * values
        return (0.1 if name.endswith(".bias") else std) * values

    write_safetensors(dest, shapes, dict.fromkeys(shapes, dtype), make,
                      max_shard_bytes=MAX_SHARD_BYTES)


def write_random_weights(config_dir: Path, dest: Path) -> None:
    """Random safetensors in `dest` (for tests and GPU checks) with exactly the tensor names,
    shapes and dtype that the config.json in `config_dir` calls for (std from its
    `initializer_range`, as transformers initialises)."""
    config = read_model_config(config_dir)
    cfg = Qwen3Config.from_dict(config)
    dtype_name = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    dtype = _DTYPES.get(dtype_name)
    if dtype is None:
        raise ModelConfigError(
            f"config.json: torch_dtype {dtype_name!r} is not one of {', '.join(_DTYPES)}")
    std = float(config.get("initializer_range", 0.02))
    log.info("writing random %s weights for %s into %s", dtype_name, config_dir, dest)
    write_weights(cfg, Path(dest), std=std, dtype=dtype)
