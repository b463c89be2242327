"""Random-weight Qwen3.5 safetensors at a config's real shapes, in the `Qwen3_5ForCausalLM`
layout (written by openinfer-core's `write_safetensors`, without transformers): the demo
checkpoint's weights, and checkpoints for GPU checks that transformers reads too."""

from __future__ import annotations

from pathlib import Path

import torch

from openinfer_core.weights.safetensors_writer import write_safetensors
from openinfer_qwen35.config import FULL, Qwen35Config


def tensor_shapes(cfg: Qwen35Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of a HuggingFace Qwen3_5ForCausalLM checkpoint, by name, in file order."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    heads = cfg.linear_value_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for n, kind in enumerate(cfg.layer_types):
        p = f"model.layers.{n}."
        shapes[p + "input_layernorm.weight"] = (h,)
        if kind == FULL:
            a = p + "self_attn."
            shapes |= {a + "q_proj.weight": (2 * cfg.q_size, h),
                       a + "k_proj.weight": (cfg.kv_size, h),
                       a + "v_proj.weight": (cfg.kv_size, h),
                       a + "o_proj.weight": (h, cfg.q_size),
                       a + "q_norm.weight": (d,), a + "k_norm.weight": (d,)}
        else:
            a = p + "linear_attn."
            shapes |= {a + "in_proj_qkv.weight": (cfg.conv_dim, h),
                       a + "in_proj_z.weight": (cfg.value_dim, h),
                       a + "in_proj_b.weight": (heads, h), a + "in_proj_a.weight": (heads, h),
                       a + "conv1d.weight": (cfg.conv_dim, 1, cfg.conv_kernel),
                       a + "dt_bias": (heads,), a + "A_log": (heads,),
                       a + "norm.weight": (cfg.linear_value_dim,),
                       a + "out_proj.weight": (h, cfg.value_dim)}
        shapes |= {p + "post_attention_layernorm.weight": (h,),
                   p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                   p + "mlp.down_proj.weight": (h, i)}
    shapes["model.norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


def write_weights(cfg: Qwen35Config, dest: Path, *, std: float, dtype: torch.dtype,
                  seed: int = 0) -> None:
    """Random safetensors for `cfg` in `dest`. Zero-centred norms near 0 (a factor near 1),
    the gated norm near 1, decays as transformers initialises them (A in [1, 16], dt_bias
    1), everything else normal with `std`; one CPU generator drawn in file order, so the same
    seed gives the same tensors everywhere."""
    shapes = tensor_shapes(cfg)
    gen = torch.Generator().manual_seed(seed)

    def make(name: str) -> torch.Tensor:
        values = torch.randn(shapes[name], generator=gen, dtype=torch.float32)
        if name.endswith("linear_attn.norm.weight"):
            return 1.0 + 0.1 * values
        if name.endswith("norm.weight"):
            return 0.1 * values
        if name.endswith("A_log"):
            return torch.rand(shapes[name], generator=gen).mul(15).add(1).log()
        if name.endswith("dt_bias"):
            return torch.ones(shapes[name])
        return std * values

    write_safetensors(dest, shapes, dict.fromkeys(shapes, dtype), make)
