"""`reference.ModelWeights` from a state dict in transformers' module names
(`DeepseekV4ForCausalLM.state_dict()`). Its `save_pretrained` writes DeepSeek's names instead
(`deepseek_names.py`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.reference import (
    AttentionWeights,
    CompressorWeights,
    HyperConnectionWeights,
    IndexerWeights,
    LayerWeights,
    ModelWeights,
    MoEWeights,
)


def weights_from_transformers(state: Mapping[str, torch.Tensor],
                              cfg: DeepseekV4Config) -> ModelWeights:
    def hc(prefix: str, names: tuple[str, str, str] = ("fn", "base", "scale")
           ) -> HyperConnectionWeights:
        return HyperConnectionWeights(*(state[f"{prefix}.{n}"] for n in names))

    def compressor(prefix: str) -> CompressorWeights:
        return CompressorWeights(state[f"{prefix}.kv_proj.weight"],
                                 state[f"{prefix}.gate_proj.weight"],
                                 state[f"{prefix}.position_bias"],
                                 state[f"{prefix}.kv_norm.weight"])

    layers = []
    for i, kind in enumerate(cfg.attention_kinds):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        indexer = f"{a}.compressor.indexer"
        attention = AttentionWeights(
            q_a=state[f"{a}.q_a_proj.weight"], q_a_norm=state[f"{a}.q_a_norm.weight"],
            q_b=state[f"{a}.q_b_proj.weight"], kv=state[f"{a}.kv_proj.weight"],
            kv_norm=state[f"{a}.kv_norm.weight"], o_a=state[f"{a}.o_a_proj.weight"],
            o_b=state[f"{a}.o_b_proj.weight"], sinks=state[f"{a}.sinks"],
            compressor=None if kind == "window" else compressor(f"{a}.compressor"),
            indexer=None if kind != "csa" else IndexerWeights(
                compressor(indexer), state[f"{indexer}.q_b_proj.weight"],
                state[f"{indexer}.scorer.weights_proj.weight"]))
        m = f"{p}.mlp"
        shared = f"{m}.shared_experts"
        moe = MoEWeights(
            gate=state[f"{m}.gate.weight"],
            bias=None if cfg.hash_layers[i] else state[f"{m}.gate.e_score_correction_bias"],
            tid2eid=state[f"{m}.gate.tid2eid"] if cfg.hash_layers[i] else None,
            gate_up=state[f"{m}.experts.gate_up_proj"], down=state[f"{m}.experts.down_proj"],
            shared_gate_up=torch.cat([state[f"{shared}.gate_proj.weight"],
                                      state[f"{shared}.up_proj.weight"]]),
            shared_down=state[f"{shared}.down_proj.weight"])
        layers.append(LayerWeights(hc(f"{p}.attn_hc"), state[f"{p}.input_layernorm.weight"],
                                   attention, hc(f"{p}.ffn_hc"),
                                   state[f"{p}.post_attention_layernorm.weight"], moe))
    return ModelWeights(embed=state["model.embed_tokens.weight"], layers=layers,
                        hc_head=hc("model.hc_head", ("hc_fn", "hc_base", "hc_scale")),
                        norm=state["model.norm.weight"], lm_head=state["lm_head.weight"])
