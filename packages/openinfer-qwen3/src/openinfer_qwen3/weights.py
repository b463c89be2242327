"""Qwen3 tensors from a HuggingFace checkpoint: names mapped, q/k/v and gate/up fused at load."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openinfer_core.weights.checkpoint import Checkpoint, RandomCheckpoint
from openinfer_qwen3.config import Qwen3Config


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [q_size + 2 * kv_size, H]
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor  # [D]
    k_norm: torch.Tensor  # [D]
    o_proj: torch.Tensor  # [H, q_size]
    post_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2 * I, H]
    down: torch.Tensor  # [H, I]


@dataclass(slots=True)
class Qwen3Weights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H]; the embedding itself when tied

    def decode_bytes(self) -> int:
        """Bytes one decode step reads: every weight once, except an untied embedding table,
        of which only the looked-up rows are read."""
        tensors = [self.final_norm, self.lm_head]
        for layer in self.layers:
            tensors += [t for t in (layer.input_norm, layer.qkv, layer.qkv_bias, layer.q_norm,
                                    layer.k_norm, layer.o_proj, layer.post_norm, layer.gate_up,
                                    layer.down) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)


def load_weights(ckpt: Checkpoint | RandomCheckpoint, cfg: Qwen3Config, *, dtype: torch.dtype,
                 device: torch.device) -> Qwen3Weights:
    """Read every tensor Qwen3 needs, checking shapes against `cfg` (errors name the tensor)."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim

    def get(name: str, *shape: int) -> torch.Tensor:
        return ckpt.get(name, shape=shape, dtype=dtype, device=device)

    layers = []
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        attn, mlp = p + "self_attn.", p + "mlp."
        qkv = torch.cat([get(attn + "q_proj.weight", cfg.q_size, h),
                         get(attn + "k_proj.weight", cfg.kv_size, h),
                         get(attn + "v_proj.weight", cfg.kv_size, h)])
        bias = None
        if cfg.attention_bias:
            bias = torch.cat([get(attn + "q_proj.bias", cfg.q_size),
                              get(attn + "k_proj.bias", cfg.kv_size),
                              get(attn + "v_proj.bias", cfg.kv_size)])
        layers.append(LayerWeights(
            input_norm=get(p + "input_layernorm.weight", h),
            qkv=qkv,
            qkv_bias=bias,
            q_norm=get(attn + "q_norm.weight", d),
            k_norm=get(attn + "k_norm.weight", d),
            o_proj=get(attn + "o_proj.weight", h, cfg.q_size),
            post_norm=get(p + "post_attention_layernorm.weight", h),
            gate_up=torch.cat([get(mlp + "gate_proj.weight", i, h),
                               get(mlp + "up_proj.weight", i, h)]),
            down=get(mlp + "down_proj.weight", h, i),
        ))
    embed = get("model.embed_tokens.weight", cfg.vocab_size, h)
    lm_head = embed if cfg.tie_word_embeddings else get("lm_head.weight", cfg.vocab_size, h)
    return Qwen3Weights(embed, layers, get("model.norm.weight", h), lm_head)
