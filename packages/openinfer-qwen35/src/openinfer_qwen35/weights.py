"""Qwen3.5 tensors from a HuggingFace checkpoint, either form: `Qwen3_5ForCausalLM`'s
(`model.layers...`) or `Qwen3_5ForConditionalGeneration`'s (`model.language_model.layers...`,
beside the vision tower `model.visual.*`, which is skipped). The multi-token-prediction head
(`mtp.*`) is not read either. At load, projections that read the same input are fused (one
GEMM each) and the zero-centred norms' `1 + w` is taken once."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from openinfer_core.weights.checkpoint import Checkpoint, RandomCheckpoint
from openinfer_core.weights.fp8_checkpoint import read_unquantized
from openinfer_qwen35.config import FULL, Qwen35Config

log = logging.getLogger("openinfer.qwen35")

# Reads a tensor by name and full shape (`load_weights`' `get` and `centred`).
Reader = Callable[..., torch.Tensor]


@dataclass(slots=True)
class AttentionWeights:
    """A gated full-attention layer. `qkvg` rows: queries, keys, values, then the output
    gate (the checkpoint's q_proj interleaves each head's query and gate; split here)."""

    qkvg: torch.Tensor  # [2 * q_size + 2 * kv_size, H]
    q_norm: torch.Tensor  # [D] fp32, 1 + w
    k_norm: torch.Tensor  # [D] fp32, 1 + w
    o_proj: torch.Tensor  # [H, q_size]


@dataclass(slots=True)
class DeltaNetWeights:
    """A Gated DeltaNet layer. `in_proj` rows: the convolution's channels (queries, keys,
    values), the output gate z, then b (-> beta) and a (-> the decay), one per value head."""

    in_proj: torch.Tensor  # [conv_dim + value_dim + 2 * value_heads, H]
    conv: torch.Tensor  # [conv_dim, K]
    dt_bias: torch.Tensor  # [value_heads]
    a_neg: torch.Tensor  # [value_heads] fp32: -exp(A_log)
    norm: torch.Tensor  # [value_head_dim], a plain RMSNorm weight
    out_proj: torch.Tensor  # [H, value_dim]


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor  # [H] fp32, 1 + w
    mixer: AttentionWeights | DeltaNetWeights
    post_norm: torch.Tensor  # [H] fp32, 1 + w
    gate_up: torch.Tensor  # [2 * I, H]
    down: torch.Tensor  # [H, I]


@dataclass(slots=True)
class Qwen35Weights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [H] fp32, 1 + w
    lm_head: torch.Tensor  # [V, H]; the embedding itself when tied

    def decode_bytes(self) -> int:
        """Bytes one decode step reads: every weight once except the embedding table (only
        the looked-up rows), which counts where it is the LM head too."""
        tensors: list[torch.Tensor] = [self.final_norm, self.lm_head]
        for layer in self.layers:
            tensors += [layer.input_norm, layer.post_norm, layer.gate_up, layer.down]
            tensors += [getattr(layer.mixer, name) for name in layer.mixer.__slots__]
        return sum(t.numel() * t.element_size() for t in tensors)


def language_model_prefix(ckpt: Checkpoint | RandomCheckpoint) -> str:
    """`model.language_model.` (the published multimodal form, which transformers'
    Qwen3_5ForCausalLM also reads) or `model.`."""
    if isinstance(ckpt, Checkpoint) and "model.language_model.embed_tokens.weight" not in ckpt:
        return "model."
    return "model.language_model."


def load_weights(ckpt: Checkpoint | RandomCheckpoint, cfg: Qwen35Config, *,
                 dtype: torch.dtype, device: torch.device) -> Qwen35Weights:
    """Every tensor the language model needs, checked against `cfg` (errors name the
    tensor)."""
    h = cfg.hidden_size
    base = language_model_prefix(ckpt)
    _log_skipped(ckpt, base)

    def get(name: str, *shape: int, as_dtype: torch.dtype = dtype) -> torch.Tensor:
        return read_unquantized(ckpt, name, shape=shape, dtype=as_dtype, device=device)

    def centred(name: str, size: int) -> torch.Tensor:
        """A zero-centred RMSNorm weight w as the factor it applies, 1 + w, kept in fp32 (as
        transformers adds it; in bf16 the sum would lose w's low bits)."""
        return 1.0 + get(name, size, as_dtype=torch.float32)

    layers = []
    for n, kind in enumerate(cfg.layer_types):
        p = f"{base}layers.{n}."
        mixer = (_attention(get, centred, p + "self_attn.", cfg) if kind == FULL
                 else _delta_net(get, p + "linear_attn.", cfg))
        i = cfg.intermediate_size
        layers.append(LayerWeights(
            input_norm=centred(p + "input_layernorm.weight", h),
            mixer=mixer,
            post_norm=centred(p + "post_attention_layernorm.weight", h),
            gate_up=torch.cat([get(p + "mlp.gate_proj.weight", i, h),
                               get(p + "mlp.up_proj.weight", i, h)]),
            down=get(p + "mlp.down_proj.weight", h, i),
        ))
    embed = get(base + "embed_tokens.weight", cfg.vocab_size, h)
    lm_head = embed if cfg.tie_word_embeddings else get("lm_head.weight", cfg.vocab_size, h)
    return Qwen35Weights(embed, layers, centred(base + "norm.weight", h), lm_head)


def _attention(get: Reader, centred: Reader, p: str, cfg: Qwen35Config) -> AttentionWeights:
    h, d = cfg.hidden_size, cfg.head_dim
    q_gate = get(p + "q_proj.weight", 2 * cfg.q_size, h).view(cfg.num_heads, 2, d, h)
    return AttentionWeights(
        qkvg=torch.cat([q_gate[:, 0].reshape(cfg.q_size, h),
                        get(p + "k_proj.weight", cfg.kv_size, h),
                        get(p + "v_proj.weight", cfg.kv_size, h),
                        q_gate[:, 1].reshape(cfg.q_size, h)]),
        q_norm=centred(p + "q_norm.weight", d),
        k_norm=centred(p + "k_norm.weight", d),
        o_proj=get(p + "o_proj.weight", h, cfg.q_size),
    )


def _delta_net(get: Reader, p: str, cfg: Qwen35Config) -> DeltaNetWeights:
    h, heads = cfg.hidden_size, cfg.linear_value_heads
    return DeltaNetWeights(
        in_proj=torch.cat([get(p + "in_proj_qkv.weight", cfg.conv_dim, h),
                           get(p + "in_proj_z.weight", cfg.value_dim, h),
                           get(p + "in_proj_b.weight", heads, h),
                           get(p + "in_proj_a.weight", heads, h)]),
        conv=get(p + "conv1d.weight", cfg.conv_dim, 1, cfg.conv_kernel)[:, 0].contiguous(),
        dt_bias=get(p + "dt_bias", heads, as_dtype=torch.float32),
        a_neg=-get(p + "A_log", heads, as_dtype=torch.float32).exp(),
        norm=get(p + "norm.weight", cfg.linear_value_dim),
        out_proj=get(p + "out_proj.weight", h, cfg.value_dim),
    )


def _log_skipped(ckpt: Checkpoint | RandomCheckpoint, base: str) -> None:
    """One line naming what the checkpoint holds that this line does not serve."""
    names = ckpt.names()
    vision = sum(1 for n in names if n.startswith(("model.visual.", "visual.")))
    mtp = sum(1 for n in names if n.startswith("mtp."))
    if vision or mtp:
        log.info("qwen3.5: serving the language model (%s*); skipped %d vision-tower and %d "
                 "multi-token-prediction tensors", base, vision, mtp)
