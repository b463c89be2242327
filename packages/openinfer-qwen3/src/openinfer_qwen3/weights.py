"""Qwen3 tensors from a HuggingFace checkpoint: names mapped, q/k/v and gate/up fused at load;
under tensor parallelism only the rank's slices are read (`Qwen3Shard`). A checkpoint in HF's
block-scaled FP8 layout has its linears dequantized to the model's dtype at load, each part
before the fusing, or, with `keep_fp8`, kept FP8 where they can be (`fp8_weights`); per-
channel FP8 is dequantized as it is read. With `quantize` (`--quantization fp8`) each fused
linear of an unquantized checkpoint is quantized to block-scaled FP8 as it is built, so
the bf16 weights never all sit in memory at once."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from openinfer_core.distributed.sharding import (
    HeadShard,
    VocabShard,
    attention_heads,
    split_range,
    vocab_shard,
)
from openinfer_core.weights.checkpoint import Checkpoint, RandomCheckpoint
from openinfer_core.weights.fp8_checkpoint import Fp8BlockWeight, read_linear, read_unquantized
from openinfer_core.weights.quantization import ChannelFp8
from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.fp8_weights import Linear, fuse, nbytes

log = logging.getLogger("openinfer.qwen3")


@dataclass(frozen=True, slots=True)
class Qwen3Shard:
    """The part of Qwen3 one tensor-parallel rank holds: q/k/v and gate/up are split by output
    rows (column-parallel), o and down by input columns (row-parallel: their outputs are
    partial sums, all-reduced), the embedding and LM head by vocabulary rows; norms are
    replicated. Rank 0 of 1 holds everything."""

    heads: HeadShard
    intermediate: range
    vocab: VocabShard

    @classmethod
    def of(cls, cfg: Qwen3Config, rank: int = 0, size: int = 1) -> Qwen3Shard:
        return cls(attention_heads(cfg.num_heads, cfg.num_kv_heads, rank, size),
                   split_range(cfg.intermediate_size, size, rank),
                   vocab_shard(cfg.vocab_size, rank, size))

    def local_config(self, cfg: Qwen3Config) -> Qwen3Config:
        """`cfg` with this rank's head counts and MLP width (the vocabulary stays whole: it
        is the size of the logits every rank returns)."""
        return dataclasses.replace(cfg, num_heads=len(self.heads.q_heads),
                                   num_kv_heads=len(self.heads.kv_heads),
                                   intermediate_size=len(self.intermediate))


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    # Shapes at one rank; a tensor-parallel rank holds its heads' and MLP columns' parts.
    # Linears are plain tensors or, kept FP8 (`fp8_weights`), e4m3 with block scales.
    qkv: Linear  # [q_size + 2 * kv_size, H]
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor  # [D]
    k_norm: torch.Tensor  # [D]
    o_proj: Linear  # [H, q_size]
    post_norm: torch.Tensor  # [H]
    gate_up: Linear  # [2 * I, H]
    down: Linear  # [H, I]


@dataclass(slots=True)
class Qwen3Weights:
    embed: torch.Tensor  # [V, H] (a rank's [padded vocabulary part, H])
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # like `embed`; the embedding itself when tied

    def decode_bytes(self) -> int:
        """Bytes one decode step reads: every weight once, except an untied embedding table,
        of which only the looked-up rows are read; an FP8 linear's e4m3 values and scales."""
        weights: list[Linear | None] = [self.final_norm, self.lm_head]
        for layer in self.layers:
            weights += [layer.input_norm, layer.qkv, layer.qkv_bias, layer.q_norm, layer.k_norm,
                        layer.o_proj, layer.post_norm, layer.gate_up, layer.down]
        return sum(nbytes(w) for w in weights)


def load_weights(ckpt: Checkpoint | RandomCheckpoint, cfg: Qwen3Config, *, dtype: torch.dtype,
                 device: torch.device, shard: Qwen3Shard | None = None,
                 keep_fp8: bool = False, quantize: bool = False) -> Qwen3Weights:
    """Read every tensor Qwen3 needs (only `shard`'s slices of them; default: all), checking
    full shapes against `cfg` (errors name the tensor). The embedding and LM head get zero
    rows up to `shard.vocab.padded`. FP8 linears (`cfg.quantization`) are dequantized, or with
    `keep_fp8` kept as `Fp8BlockWeight` wherever `fp8_weights.fuse` can keep them (the
    others' reasons logged once). `quantize`: the linears of an unquantized checkpoint
    quantized to block-scaled FP8 (kept with `keep_fp8`, else dequantized again); not the
    embedding, LM head or norms."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    shard = shard or Qwen3Shard.of(cfg)
    q_rows = _scaled(shard.heads.q_heads, d)
    kv_rows = _scaled(shard.heads.kv_heads, d)

    def get(name: str, *shape: int, dim: int = 0, part: range | None = None) -> torch.Tensor:
        return read_unquantized(ckpt, name, shape=shape, dtype=dtype, device=device, dim=dim,
                                part=part)

    def linear(name: str, out: int, inp: int, *, dim: int = 0,
               part: range | None = None) -> torch.Tensor | Fp8BlockWeight:
        return read_linear(ckpt, name, shape=(out, inp), quant=cfg.quantization, dtype=dtype,
                           device=device, dim=dim, part=part)

    dequantized: dict[str, str] = {}  # what was dequantized although keep_fp8: why

    def fused(what: str, *parts: torch.Tensor | Fp8BlockWeight) -> Linear:
        w, why = fuse(list(parts), dtype=dtype, keep=keep_fp8, quantize=quantize)
        if why is not None:
            dequantized.setdefault(what, why)
        return w

    # A checkpoint saved from transformers' base `Qwen3Model` (sentence-transformers', as
    # Qwen3-Embedding's) names its tensors without the "model." prefix and has no LM head.
    base = "model." if "model.embed_tokens.weight" in ckpt else ""
    layers = []
    for n in range(cfg.num_layers):
        p = f"{base}layers.{n}."
        attn, mlp = p + "self_attn.", p + "mlp."
        qkv = fused("q/k/v", linear(attn + "q_proj.weight", cfg.q_size, h, part=q_rows),
                    linear(attn + "k_proj.weight", cfg.kv_size, h, part=kv_rows),
                    linear(attn + "v_proj.weight", cfg.kv_size, h, part=kv_rows))
        bias = None
        if cfg.attention_bias:
            bias = torch.cat([get(attn + "q_proj.bias", cfg.q_size, part=q_rows),
                              get(attn + "k_proj.bias", cfg.kv_size, part=kv_rows),
                              get(attn + "v_proj.bias", cfg.kv_size, part=kv_rows)])
        layers.append(LayerWeights(
            input_norm=get(p + "input_layernorm.weight", h),
            qkv=qkv,
            qkv_bias=bias,
            q_norm=get(attn + "q_norm.weight", d),
            k_norm=get(attn + "k_norm.weight", d),
            o_proj=fused("o_proj", linear(attn + "o_proj.weight", h, cfg.q_size, dim=1,
                                          part=q_rows)),
            post_norm=get(p + "post_attention_layernorm.weight", h),
            gate_up=fused("gate/up",
                          linear(mlp + "gate_proj.weight", i, h, part=shard.intermediate),
                          linear(mlp + "up_proj.weight", i, h, part=shard.intermediate)),
            down=fused("down", linear(mlp + "down_proj.weight", h, i, dim=1,
                                      part=shard.intermediate)),
        ))

    def vocab_rows(name: str) -> torch.Tensor:
        rows = get(name, cfg.vocab_size, h, part=shard.vocab.rows)
        missing = shard.vocab.padded - rows.shape[0]
        return F.pad(rows, (0, 0, 0, missing)) if missing else rows

    if isinstance(cfg.quantization, ChannelFp8):
        log.info("qwen3: per-channel FP8 linears (%s) dequantized to %s at load: the FP8 "
                 "kernels read 128x128 block scales only", cfg.quantization.scheme, dtype)
    elif quantize:
        log.info("qwen3: linears quantized to FP8 (128x128 blocks) at load, %s",
                 "kept FP8" if keep_fp8 else f"dequantized again to {dtype}")
    for what, why in dequantized.items():
        log.info("qwen3: FP8 %s dequantized to %s at load (%s)", what, dtype, why)
    embed = vocab_rows(base + "embed_tokens.weight")
    lm_head = embed
    if not cfg.tie_word_embeddings and "lm_head.weight" in ckpt:
        lm_head = vocab_rows("lm_head.weight")
    elif not cfg.tie_word_embeddings:
        log.warning("qwen3: the checkpoint has no lm_head.weight (a base model's save): its "
                    "hidden states serve embeddings; generated tokens would be meaningless")
    return Qwen3Weights(embed, layers, get(base + "norm.weight", h), lm_head)


def _scaled(heads: range, head_dim: int) -> range:
    """The weight rows (or columns) of `heads`."""
    return range(heads.start * head_dim, heads.stop * head_dim)
