"""Tiny DeepSeek-V4 checkpoints for tests: transformers' model written as a model folder, and
its weights in DeepSeek's own names and formats (FP8 with 128 x 128 block scales, FP4 routed
experts with per-32 scales, E8M0 scales), quantized by the test's own arithmetic, independent
of the loader's."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.tokenizer_files import write_tokenizer_files


def random_model(config: Any, *, scale: float, seed: int = 0) -> torch.nn.Module:
    """A transformers DeepseekV4ForCausalLM of `config` with random weights: N(0, scale)
    (N(0, 0.5) for the hyper-connections), random token -> experts tables in the hash layers,
    small router biases in the others."""
    import transformers

    model = transformers.DeepseekV4ForCausalLM(config).eval()
    g = torch.Generator().manual_seed(seed)
    experts = config.n_routed_experts
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if "hc" in name else scale))
        for layer in model.model.layers:
            gate = layer.mlp.gate
            if hasattr(gate, "tid2eid"):
                gate.tid2eid.copy_(torch.stack([
                    torch.randperm(experts, generator=g)[:config.num_experts_per_tok]
                    for _ in range(config.vocab_size)]))
            else:
                gate.e_score_correction_bias.copy_(torch.randn(experts, generator=g) * 0.1)
    return model


def write_model_folder(model: torch.nn.Module, folder: Path,
                       tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """`model` as `save_pretrained` writes it (config.json, safetensors), with DeepSeek-V4's
    tokenizer files; with `tensors`, those are the weights instead."""
    model.save_pretrained(folder)  # type: ignore[operator]
    if tensors is not None:
        for f in folder.glob("*.safetensors*"):
            f.unlink()
        save_file({k: v.contiguous() for k, v in tensors.items()},
                  str(folder / "model.safetensors"))
    return write_tokenizer_files(folder)


MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _e8m0(exponents: torch.Tensor) -> torch.Tensor:
    return (exponents + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3 values, E8M0 block scales, the dequantized copy) with one power-of-two scale per
    128 x 128 block: 2^ceil(log2(amax / 448))."""
    rows, cols = w.shape
    br, bc = math.ceil(rows / 128), math.ceil(cols / 128)
    exps = torch.zeros(br, bc, dtype=torch.int32)
    codes = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    copy = torch.empty(rows, cols)
    for i in range(br):
        for j in range(bc):
            block = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            e = math.ceil(math.log2(block.abs().max().item() / 448))
            exps[i, j] = e
            q = (block / 2.0 ** e).to(torch.float8_e4m3fn)
            codes[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = q
            copy[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = q.float() * 2.0 ** e
    return codes, _e8m0(exps), copy


def quantize_fp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e2m1 codes packed two per byte along a row, E8M0 scales per 32 values, the
    dequantized copy): each value to the nearest e2m1 magnitude after its group's scale."""
    rows, cols = w.shape
    groups = w.view(rows, cols // 32, 32)
    exps = torch.ceil(torch.log2(groups.abs().amax(-1) / 6)).to(torch.int32)
    scales = torch.exp2(exps.float())[..., None]
    scaled = groups / scales
    index = (scaled.abs()[..., None] - MAGNITUDES).abs().argmin(-1)
    codes = (index + 8 * (scaled < 0)).view(rows, cols)
    packed = (codes[:, 0::2] | codes[:, 1::2] << 4).to(torch.uint8).view(torch.int8)
    copy = MAGNITUDES[index] * scaled.sign() * scales
    return packed, _e8m0(exps), copy.view(rows, cols)


FP8 = {"q_a_proj": "wq_a", "q_b_proj": "wq_b", "kv_proj": "wkv", "o_a_proj": "wo_a",
       "o_b_proj": "wo_b"}


def to_deepseek(state: dict[str, torch.Tensor], cfg: DeepseekV4Config
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """transformers' state -> (DeepSeek's names and formats, transformers' names with every
    quantized tensor replaced by its dequantized copy)."""
    out: dict[str, torch.Tensor] = {}
    same = dict(state)

    def fp8(hf: str, ds: str) -> None:
        codes, scale, copy = quantize_fp8(state[hf])
        out[f"{ds}.weight"], out[f"{ds}.scale"], same[hf] = codes, scale, copy

    out |= {"embed.weight": state["model.embed_tokens.weight"],
            "head.weight": state["lm_head.weight"], "norm.weight": state["model.norm.weight"],
            **{f"hc_head_{n}": state[f"model.hc_head.hc_{n}"] for n in ("fn", "base", "scale")}}
    for i, kind in enumerate(cfg.attention_kinds):
        p, d = f"model.layers.{i}", f"layers.{i}"
        a, da = f"{p}.self_attn", f"{d}.attn"
        for hf_name, ds_name in FP8.items():
            fp8(f"{a}.{hf_name}.weight", f"{da}.{ds_name}")
        out[f"{da}.q_norm.weight"] = state[f"{a}.q_a_norm.weight"]
        out[f"{da}.kv_norm.weight"] = state[f"{a}.kv_norm.weight"]
        out[f"{da}.attn_sink"] = state[f"{a}.sinks"]
        compressors = {} if kind == "window" else {f"{a}.compressor": f"{da}.compressor"}
        if kind == "csa":
            idx = f"{a}.compressor.indexer"
            compressors[idx] = f"{da}.indexer.compressor"
            fp8(f"{idx}.q_b_proj.weight", f"{da}.indexer.wq_b")
            out[f"{da}.indexer.weights_proj.weight"] = state[f"{idx}.scorer.weights_proj.weight"]
        for hf_c, ds_c in compressors.items():
            out[f"{ds_c}.wkv.weight"] = state[f"{hf_c}.kv_proj.weight"]
            out[f"{ds_c}.wgate.weight"] = state[f"{hf_c}.gate_proj.weight"]
            out[f"{ds_c}.ape"] = state[f"{hf_c}.position_bias"]
            out[f"{ds_c}.norm.weight"] = state[f"{hf_c}.kv_norm.weight"]
        m, f = f"{p}.mlp", f"{d}.ffn"
        out[f"{f}.gate.weight"] = state[f"{m}.gate.weight"]
        if cfg.hash_layers[i]:
            out[f"{f}.gate.tid2eid"] = state[f"{m}.gate.tid2eid"]
        else:
            out[f"{f}.gate.bias"] = state[f"{m}.gate.e_score_correction_bias"]
        for ds_w, hf_w in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")):
            fp8(f"{m}.shared_experts.{hf_w}.weight", f"{f}.shared_experts.{ds_w}")
        gate_up, down = state[f"{m}.experts.gate_up_proj"], state[f"{m}.experts.down_proj"]
        inter = gate_up.shape[1] // 2
        copies: dict[str, list[torch.Tensor]] = {"w1": [], "w3": [], "w2": []}
        for e in range(cfg.num_experts):
            for name, w in (("w1", gate_up[e, :inter]), ("w3", gate_up[e, inter:]),
                            ("w2", down[e])):
                packed, scale, copy = quantize_fp4(w)
                out[f"{f}.experts.{e}.{name}.weight"] = packed
                out[f"{f}.experts.{e}.{name}.scale"] = scale
                copies[name].append(copy)
        same[f"{m}.experts.gate_up_proj"] = torch.cat(
            [torch.stack(copies["w1"]), torch.stack(copies["w3"])], dim=1)
        same[f"{m}.experts.down_proj"] = torch.stack(copies["w2"])
        out[f"{d}.attn_norm.weight"] = state[f"{p}.input_layernorm.weight"]
        out[f"{d}.ffn_norm.weight"] = state[f"{p}.post_attention_layernorm.weight"]
        for sub in ("attn", "ffn"):
            for n in ("fn", "base", "scale"):
                out[f"{d}.hc_{sub}_{n}"] = state[f"{p}.{sub}_hc.{n}"]
    return out, same
