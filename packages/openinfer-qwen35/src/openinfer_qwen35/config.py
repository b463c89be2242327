"""Qwen3.5 config.json, read and checked: the language model's settings, from a
`Qwen3_5ForCausalLM` config (`qwen3_5_text`, the language model alone) or from the
`text_config` of a `Qwen3_5ForConditionalGeneration` one (`qwen3_5`, with a vision tower that
this line does not serve)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openinfer_core.errors import ModelConfigError
from openinfer_core.model_config import ConfigReader

LINEAR = "linear_attention"
FULL = "full_attention"


@dataclass(frozen=True, slots=True)
class Qwen35Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: tuple[str, ...]  # LINEAR or FULL per layer
    # Full (gated) attention layers.
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int  # the leading dims of each head that rotate (partial_rotary_factor)
    rope_theta: float
    # Gated DeltaNet layers.
    conv_kernel: int
    linear_key_heads: int
    linear_value_heads: int
    linear_key_dim: int
    linear_value_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    # The checkpoint is a Qwen3_5ForConditionalGeneration: its vision tower is skipped.
    multimodal: bool = False

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def key_dim(self) -> int:
        """Width of a linear layer's queries (and of its keys), all heads."""
        return self.linear_key_heads * self.linear_key_dim

    @property
    def value_dim(self) -> int:
        return self.linear_value_heads * self.linear_value_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the short convolution: queries, keys and values."""
        return 2 * self.key_dim + self.value_dim

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == LINEAR)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == FULL)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> Qwen35Config:
        text = config.get("text_config")
        multimodal = config.get("model_type") == "qwen3_5" or text is not None
        if multimodal and not isinstance(text, dict):
            raise ModelConfigError("config.json: a qwen3_5 config needs a text_config object")
        body: dict[str, Any] = text if isinstance(text, dict) else config
        _refuse_unsupported(config, body)
        r = ConfigReader(body)
        num_heads, num_kv_heads = r.grouped("num_attention_heads", "num_key_value_heads")
        v_heads, k_heads = r.grouped("linear_num_value_heads", "linear_num_key_heads", 32, 16)
        head_dim = r.int("head_dim", 256)
        rope = _rope(body)
        rotary_dim = int(head_dim * rope["partial_rotary_factor"])
        if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
            raise ModelConfigError(
                f"config.json: head_dim {head_dim} x partial_rotary_factor "
                f"{rope['partial_rotary_factor']} must give an even rotary width")
        # The ConditionalGeneration form ties (or not) at its top level.
        tie_source = config if multimodal and "tie_word_embeddings" in config else body
        return cls(
            vocab_size=r.int("vocab_size"),
            hidden_size=r.int("hidden_size"),
            intermediate_size=r.int("intermediate_size"),
            layer_types=_layer_types(body, r.int("num_hidden_layers")),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rotary_dim=rotary_dim,
            rope_theta=rope["rope_theta"],
            conv_kernel=r.int("linear_conv_kernel_dim", 4),
            linear_key_heads=k_heads,
            linear_value_heads=v_heads,
            linear_key_dim=r.int("linear_key_head_dim", 128),
            linear_value_dim=r.int("linear_value_head_dim", 128),
            rms_norm_eps=r.float("rms_norm_eps", 1e-6),
            max_position_embeddings=r.int("max_position_embeddings", 32768),
            tie_word_embeddings=ConfigReader(tie_source).bool("tie_word_embeddings", False),
            multimodal=multimodal,
        )


def _refuse_unsupported(config: dict[str, Any], body: dict[str, Any]) -> None:
    kind = body.get("model_type", config.get("model_type"))
    if kind is not None and "moe" in str(kind):
        raise ModelConfigError(
            f"config.json: model_type {kind!r} (Qwen3.5 MoE) is not supported yet; "
            "the dense Qwen3.5 line serves qwen3_5 and qwen3_5_text")
    act = body.get("hidden_act", "silu")
    if act != "silu":
        raise ModelConfigError(
            f"config.json: hidden_act {act!r} is not supported (Qwen3.5 uses 'silu')")
    if body.get("attention_bias"):
        raise ModelConfigError("config.json: attention_bias=true is not supported yet")
    if body.get("attn_output_gate", True) is not True:
        raise ModelConfigError(
            "config.json: attn_output_gate=false is not supported (Qwen3.5 gates attention)")
    for key in ("quantization_config", "mlp_only_layers"):
        if body.get(key) or config.get(key):
            raise ModelConfigError(f"config.json: {key} is not supported yet")


def _layer_types(body: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    """`layer_types` as written, or transformers' default: every `full_attention_interval`-th
    layer full attention, the others linear."""
    kinds = body.get("layer_types")
    if kinds is None:
        every = ConfigReader(body).int("full_attention_interval", 4)
        kinds = [FULL if (i + 1) % every == 0 else LINEAR for i in range(num_layers)]
    if not isinstance(kinds, list) or len(kinds) != num_layers:
        raise ModelConfigError(
            f"config.json: layer_types must list num_hidden_layers ({num_layers}) entries")
    for i, kind in enumerate(kinds):
        if kind not in (LINEAR, FULL):
            raise ModelConfigError(
                f"config.json: layer_types[{i}] is {kind!r}; expected {LINEAR!r} or {FULL!r}")
    return tuple(kinds)


def _rope(body: dict[str, Any]) -> dict[str, float]:
    """rope_theta and partial_rotary_factor, inside rope_parameters (transformers 5) or at the
    top level. Multimodal rotary (`mrope_section`) is accepted: with text alone every section
    sees the same position, which is plain rotary."""
    params = body.get("rope_parameters") or body.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ModelConfigError("config.json: rope_parameters must be an object or null")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "mrope"):
        raise ModelConfigError(
            f"config.json: rope_type {kind!r} is not supported yet (only 'default')")
    theta = params.get("rope_theta", body.get("rope_theta", 10_000.0))
    factor = params.get("partial_rotary_factor", body.get("partial_rotary_factor", 0.25))
    r = ConfigReader({"rope_theta": theta, "partial_rotary_factor": factor})
    return {"rope_theta": r.float("rope_theta"),
            "partial_rotary_factor": r.float("partial_rotary_factor")}
