"""DeepSeek-V4 config.json, read and checked, in both layouts it ships in: DeepSeek's own keys
(`compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`, `rope_scaling`) and transformers'
(`layer_types`, `compress_rates`, `mlp_layer_types`, `partial_rotary_factor`). Spec: shared
deepseek-v4.md §2."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from openinfer_core.errors import ModelConfigError
from openinfer_core.model_config import ConfigReader

# Attention kinds: window only; CSA (overlapping compression and the indexer's picks); HCA
# (all visible compressed entries). transformers' layer types name them; DeepSeek's config
# gives a ratio per layer: 0 (window only), 4 (CSA), any other (HCA; 128 in V4-Flash).
KINDS = {"sliding_attention": "window", "compressed_sparse_attention": "csa",
         "heavily_compressed_attention": "hca"}
CSA_RATIO = 4  # DeepSeek's `compress_ratios`: 4 is CSA (overlapping windows, an indexer)
_DEFAULT_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


@dataclass(frozen=True, slots=True)
class DeepseekV4Config:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    attention_kinds: tuple[str, ...]  # per layer: "window", "csa" or "hca"
    compress_ratios: tuple[int, ...]  # per layer: tokens per compressed entry (0: window)
    hash_layers: tuple[bool, ...]  # per layer: experts picked by token id
    num_experts: int
    num_shared_experts: int
    top_k: int
    moe_intermediate_size: int
    routed_scaling_factor: float
    swiglu_limit: float  # the experts' clamp; math.inf where config.json's is 0 (none)
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    rms_norm_eps: float
    rope_theta: float
    compress_rope_theta: float
    yarn: dict[str, float]  # the compressed layers' YaRN: factor, original_max_positions, betas
    max_position_embeddings: int
    # The FP8/FP4 rounding inside the forward that DeepSeek's own code applies (quant_sim.py):
    # set by the model line from config.json and OPENINFER_DSV4_QUANT_SIM.
    quant_sim: bool = False

    def rope_freqs(self, compressed: bool) -> torch.Tensor:
        """The rotary frequencies of the window-only layers (plain, theta 1e4) or of the
        layers with compressed KV (theta 1.6e5, YaRN)."""
        from openinfer_deepseek_v4.kernels.rotary import rope_frequencies

        if not compressed:
            return rope_frequencies(self.rope_head_dim, self.rope_theta)
        return rope_frequencies(self.rope_head_dim, self.compress_rope_theta,
                                yarn_factor=self.yarn["factor"],
                                original_max_positions=int(self.yarn["original_max_positions"]),
                                beta_fast=self.yarn["beta_fast"],
                                beta_slow=self.yarn["beta_slow"])

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> DeepseekV4Config:
        r = ConfigReader(config)
        n = r.int("num_hidden_layers")
        kinds, ratios = _attention_kinds(config, n)
        head_dim = r.int("head_dim")
        if r.int("num_key_value_heads", 1) != 1:
            raise ModelConfigError("config.json: DeepSeek-V4 has one shared KV head "
                                   "(num_key_value_heads = 1)")
        scoring = config.get("scoring_func", "sqrtsoftplus")
        if scoring != "sqrtsoftplus":
            raise ModelConfigError(f"config.json: scoring_func {scoring!r} is not supported "
                                   "(DeepSeek-V4 uses 'sqrtsoftplus')")
        if not r.bool("norm_topk_prob", True):
            raise ModelConfigError("config.json: norm_topk_prob=false is not supported")
        if r.bool("tie_word_embeddings", False):
            raise ModelConfigError("config.json: tie_word_embeddings=true is not supported")
        return cls(
            vocab_size=r.int("vocab_size"), hidden_size=r.int("hidden_size"), num_layers=n,
            num_heads=r.int("num_attention_heads"), head_dim=head_dim,
            rope_head_dim=_rope_head_dim(config, head_dim), q_lora_rank=r.int("q_lora_rank"),
            o_groups=r.int("o_groups"), o_lora_rank=r.int("o_lora_rank"),
            sliding_window=r.int("sliding_window"), attention_kinds=kinds,
            compress_ratios=ratios,
            hash_layers=_hash_layers(config, n), num_experts=r.int("n_routed_experts"),
            num_shared_experts=r.int("n_shared_experts", 1),
            top_k=r.int("num_experts_per_tok"),
            moe_intermediate_size=r.int("moe_intermediate_size"),
            routed_scaling_factor=r.float("routed_scaling_factor"),
            # 0 means no clamp, as in DeepSeek's own code: the kernels then clamp at infinity.
            swiglu_limit=r.float("swiglu_limit") or math.inf,
            index_n_heads=r.int("index_n_heads"),
            index_head_dim=r.int("index_head_dim"), index_topk=r.int("index_topk"),
            hc_mult=r.int("hc_mult"), hc_sinkhorn_iters=r.int("hc_sinkhorn_iters"),
            hc_eps=r.float("hc_eps"), rms_norm_eps=r.float("rms_norm_eps", 1e-6),
            rope_theta=_theta(config, "main", "rope_theta", 10000.0),
            compress_rope_theta=_theta(config, "compress", "compress_rope_theta", 160000.0),
            yarn=_yarn(config),
            max_position_embeddings=r.int("max_position_embeddings"),
        )


def _attention_kinds(config: dict[str, Any],
                     n: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Per layer, the attention kind and compression ratio: from `layer_types` +
    `compress_rates` (transformers) or `compress_ratios` (DeepSeek's, one more entry for the
    MTP layer, which is dropped here)."""
    types = config.get("layer_types")
    if types is not None:
        unknown = sorted(set(types) - set(KINDS))
        if unknown:
            raise ModelConfigError(f"config.json: unknown layer_types {unknown}")
        rates = {**_DEFAULT_RATES, **(config.get("compress_rates") or {}), "sliding_attention": 0}
        kinds, ratios = [KINDS[t] for t in types], [rates[t] for t in types]
    elif config.get("compress_ratios") is not None:
        # As DeepSeek's own code reads them: 0 is the window alone, 4 CSA, any other HCA.
        ratios = list(config["compress_ratios"])
        bad = sorted({r for r in ratios[:n] if not isinstance(r, int) or r < 0})
        if bad:
            raise ModelConfigError(f"config.json: compress_ratios {bad} are not whole numbers "
                                   ">= 0")
        kinds = ["window" if r == 0 else "csa" if r == CSA_RATIO else "hca" for r in ratios]
    else:
        raise ModelConfigError("config.json: needs layer_types or compress_ratios")
    if len(ratios) < n:
        raise ModelConfigError(f"config.json: {len(ratios)} layer types for {n} layers")
    if any(r < 1 for k, r in zip(kinds, ratios, strict=True) if k != "window"):
        raise ModelConfigError("config.json: compress_rates must be positive")
    return tuple(kinds[:n]), tuple(int(r) for r in ratios[:n])


def _hash_layers(config: dict[str, Any], n: int) -> tuple[bool, ...]:
    types = config.get("mlp_layer_types")
    if types is not None:
        if set(types) - {"hash_moe", "moe"} or len(types) < n:
            raise ModelConfigError(f"config.json: mlp_layer_types must give 'hash_moe' or "
                                   f"'moe' for each of the {n} layers")
        return tuple(t == "hash_moe" for t in types[:n])
    hashed = ConfigReader(config).int("num_hash_layers", 3, minimum=0)
    return tuple(i < hashed for i in range(n))


def _rope_head_dim(config: dict[str, Any], head_dim: int) -> int:
    if "qk_rope_head_dim" in config:
        return ConfigReader(config).int("qk_rope_head_dim")
    factor = config.get("partial_rotary_factor") or 64 / 512
    return int(head_dim * factor)


def _theta(config: dict[str, Any], label: str, key: str, default: float) -> float:
    """A rotary base: `rope_parameters[label]["rope_theta"]` (transformers) or the top-level
    key (DeepSeek's)."""
    params = (config.get("rope_parameters") or {}).get(label)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return ConfigReader(config).float(key, default)


def _yarn(config: dict[str, Any]) -> dict[str, float]:
    """The compressed layers' YaRN: `rope_parameters["compress"]` (transformers) or
    `rope_scaling` (DeepSeek's); factor 1 where there is none."""
    params = (config.get("rope_parameters") or {}).get("compress")
    if not isinstance(params, dict):
        params = config.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("yarn", "default"):
        raise ModelConfigError(f"config.json: rope type {kind!r} is not supported (yarn is)")
    r = ConfigReader(params, "config.json rope scaling")
    if kind == "default":
        return {"factor": 1.0, "original_max_positions": 0, "beta_fast": 32.0, "beta_slow": 1.0}
    return {"factor": r.float("factor"),
            "original_max_positions": r.int("original_max_position_embeddings"),
            "beta_fast": r.float("beta_fast", 32.0), "beta_slow": r.float("beta_slow", 1.0)}
