"""`reference.ModelWeights` from a state dict in DeepSeek's own names, as its HF repository
ships them (spec: shared deepseek-v4.md §11.1): FP8 weights with 128 x 128 block scales, FP4
routed experts with per-32 scales, the rest bf16/fp32. Quantized weights are dequantized to
`dtype` here (the reference path); MTP tensors (`mtp.*`) are not used."""

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
from openinfer_kernels.quant import dequant_fp4_ref, dequant_fp8_blocks_ref


def weights_from_deepseek(state: Mapping[str, torch.Tensor], cfg: DeepseekV4Config,
                          dtype: torch.dtype = torch.bfloat16) -> ModelWeights:
    state = {k.removeprefix("model."): v for k, v in state.items()}

    def get(name: str) -> torch.Tensor:
        t = state[name]
        scale = state.get(name.removesuffix(".weight") + ".scale")
        if scale is not None and t.dtype == torch.float8_e4m3fn:
            return dequant_fp8_blocks_ref(t, scale, dtype=dtype)
        if scale is not None and t.dtype in (torch.int8, torch.uint8):
            return dequant_fp4_ref(t, scale, dtype=dtype)
        return t.to(dtype) if t.is_floating_point() else t

    def hc(prefix: str) -> HyperConnectionWeights:
        return HyperConnectionWeights(get(f"{prefix}_fn"), get(f"{prefix}_base"),
                                      get(f"{prefix}_scale"))

    def compressor(prefix: str) -> CompressorWeights:
        return CompressorWeights(get(f"{prefix}.wkv.weight"), get(f"{prefix}.wgate.weight"),
                                 get(f"{prefix}.ape"), get(f"{prefix}.norm.weight"))

    layers = []
    for i, kind in enumerate(cfg.attention_kinds):
        a, f = f"layers.{i}.attn", f"layers.{i}.ffn"
        attention = AttentionWeights(
            q_a=get(f"{a}.wq_a.weight"), q_a_norm=get(f"{a}.q_norm.weight"),
            q_b=get(f"{a}.wq_b.weight"), kv=get(f"{a}.wkv.weight"),
            kv_norm=get(f"{a}.kv_norm.weight"), o_a=get(f"{a}.wo_a.weight"),
            o_b=get(f"{a}.wo_b.weight"), sinks=get(f"{a}.attn_sink"),
            compressor=None if kind == "window" else compressor(f"{a}.compressor"),
            indexer=None if kind != "csa" else IndexerWeights(
                compressor(f"{a}.indexer.compressor"), get(f"{a}.indexer.wq_b.weight"),
                get(f"{a}.indexer.weights_proj.weight")))
        experts = range(cfg.num_experts)
        moe = MoEWeights(
            gate=get(f"{f}.gate.weight"),
            bias=None if cfg.hash_layers[i] else get(f"{f}.gate.bias"),
            tid2eid=get(f"{f}.gate.tid2eid") if cfg.hash_layers[i] else None,
            gate_up=torch.stack([torch.cat([get(f"{f}.experts.{e}.w1.weight"),
                                            get(f"{f}.experts.{e}.w3.weight")])
                                 for e in experts]),
            down=torch.stack([get(f"{f}.experts.{e}.w2.weight") for e in experts]),
            shared_gate_up=torch.cat([get(f"{f}.shared_experts.w1.weight"),
                                      get(f"{f}.shared_experts.w3.weight")]),
            shared_down=get(f"{f}.shared_experts.w2.weight"))
        layers.append(LayerWeights(hc(f"layers.{i}.hc_attn"), get(f"layers.{i}.attn_norm.weight"),
                                   attention, hc(f"layers.{i}.hc_ffn"),
                                   get(f"layers.{i}.ffn_norm.weight"), moe))
    return ModelWeights(embed=get("embed.weight"), layers=layers, hc_head=hc("hc_head"),
                        norm=get("norm.weight"), lm_head=get("head.weight"))
