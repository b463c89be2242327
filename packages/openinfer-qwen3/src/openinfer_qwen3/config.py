"""Qwen3 dense config.json, read and checked (a quantization_config too: only FP8, block-scaled
or per-channel, is read, anything else refused)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openinfer_core.errors import ModelConfigError
from openinfer_core.model_config import ConfigReader
from openinfer_core.weights.quantization import Fp8Scheme, fp8_config


@dataclass(frozen=True, slots=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    # FP8 linears: block-scaled (HF's `quant_method: fp8`, 128 x 128 blocks) or per-channel;
    # None: unquantized.
    quantization: Fp8Scheme | None = None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> Qwen3Config:
        r = ConfigReader(config)
        num_heads, num_kv_heads = r.grouped("num_attention_heads", "num_key_value_heads")
        hidden = r.int("hidden_size")
        head_dim = config.get("head_dim") or hidden // num_heads
        if config.get("head_dim") is None and hidden % num_heads:
            raise ModelConfigError(
                f"config.json: no head_dim and hidden_size ({hidden}) is not a multiple of "
                f"num_attention_heads ({num_heads})"
            )
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise ModelConfigError(
                f"config.json: hidden_act {act!r} is not supported (Qwen3 uses 'silu')")
        if r.bool("use_sliding_window", False):
            raise ModelConfigError("config.json: use_sliding_window=true is not supported yet")
        out = cls(
            vocab_size=r.int("vocab_size"),
            hidden_size=hidden,
            intermediate_size=r.int("intermediate_size"),
            num_layers=r.int("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=ConfigReader({"head_dim": head_dim}).int("head_dim"),
            rms_norm_eps=r.float("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(config),
            max_position_embeddings=r.int("max_position_embeddings", 40960),
            tie_word_embeddings=r.bool("tie_word_embeddings", False),
            attention_bias=r.bool("attention_bias", False),
            quantization=fp8_config(config, line="qwen3"),
        )
        if out.head_dim % 2:
            raise ModelConfigError(
                f"config.json: head_dim must be even for rotary, got {out.head_dim}")
        return out


def _rope_theta(config: dict[str, Any]) -> float:
    """rope_theta, top level (transformers 4) or inside rope_parameters (transformers 5); only
    plain (unscaled) rotary is supported."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    for source, block in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(block, dict):
            raise ModelConfigError(f"config.json: {source} must be an object or null")
        kind = block.get("rope_type", block.get("type", "default"))
        if kind != "default":
            raise ModelConfigError(
                f"config.json: {source}.rope_type {kind!r} is not supported yet (only 'default')"
            )
    theta = params.get("rope_theta", config.get("rope_theta", 1_000_000.0))
    return ConfigReader({"rope_theta": theta}).float("rope_theta")
