"""A transformers `DeepseekV4ForCausalLM` in bf16 holding exactly the weights of an openinfer
DeepSeek-V4 model (FP8 and FP4 weights dequantized), for the GPU golden gate: both sides then
run the same checkpoint, ours from its formats, transformers' from the dequantized copy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.quantized import Fp4Experts, Fp8Linear
from openinfer_deepseek_v4.reference import CompressorWeights, HyperConnectionWeights, ModelWeights


def transformers_config(layers: int, **overrides: Any) -> Any:
    """V4-Flash's config (transformers' defaults are its values) cut to `layers` layers:
    window, CSA and HCA in turn, the first layer hash-routed."""
    import transformers

    kinds = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
    settings: dict[str, Any] = dict(
        num_hidden_layers=layers, layer_types=[kinds[i % 3] for i in range(layers)],
        mlp_layer_types=["hash_moe" if i == 0 else "moe" for i in range(layers)],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        rope_scaling={"type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                      "original_max_position_embeddings": 65536})
    return transformers.DeepseekV4Config(**(settings | overrides))


def _dense(w: torch.Tensor | Fp8Linear, dtype: torch.dtype) -> torch.Tensor:
    # e4m3 and e2m1 times a power of two are exact in bf16: no rounding in either dtype
    return w.dequant(dtype) if isinstance(w, Fp8Linear) else w


def _hc(prefix: str, hc: HyperConnectionWeights,
        names: tuple[str, str, str] = ("fn", "base", "scale")) -> Iterator[tuple[str, Any]]:
    yield from zip((f"{prefix}.{n}" for n in names), (hc.fn, hc.base, hc.scale), strict=True)


def _compressor(prefix: str, c: CompressorWeights) -> Iterator[tuple[str, Any]]:
    yield from ((f"{prefix}.kv_proj.weight", c.kv), (f"{prefix}.gate_proj.weight", c.gate),
                (f"{prefix}.position_bias", c.position_bias), (f"{prefix}.kv_norm.weight", c.norm))


def transformers_tensors(w: ModelWeights, cfg: DeepseekV4Config, dtype: torch.dtype
                         ) -> Iterator[tuple[str, Any]]:
    """(transformers' parameter name, tensor or a function making it) for every weight."""
    yield "model.embed_tokens.weight", w.embed
    yield "lm_head.weight", w.lm_head
    yield "model.norm.weight", w.norm
    yield from _hc("model.hc_head", w.hc_head, ("hc_fn", "hc_base", "hc_scale"))
    for i, layer in enumerate(w.layers):
        p, a = f"model.layers.{i}", w.layers[i].attention
        s = f"{p}.self_attn"
        yield from _hc(f"{p}.attn_hc", layer.attn_hc)
        yield from _hc(f"{p}.ffn_hc", layer.ffn_hc)
        yield f"{p}.input_layernorm.weight", layer.attn_norm
        yield f"{p}.post_attention_layernorm.weight", layer.ffn_norm
        for name, t in (("q_a_proj", a.q_a), ("q_b_proj", a.q_b), ("kv_proj", a.kv),
                        ("o_a_proj", a.o_a), ("o_b_proj", a.o_b)):
            yield f"{s}.{name}.weight", lambda t=t: _dense(t, dtype)
        yield f"{s}.q_a_norm.weight", a.q_a_norm
        yield f"{s}.kv_norm.weight", a.kv_norm
        yield f"{s}.sinks", a.sinks
        if a.compressor is not None:
            yield from _compressor(f"{s}.compressor", a.compressor)
        if a.indexer is not None:
            idx = f"{s}.compressor.indexer"
            yield from _compressor(idx, a.indexer.compressor)
            yield f"{idx}.q_b_proj.weight", lambda t=a.indexer.q_b: _dense(t, dtype)
            yield f"{idx}.scorer.weights_proj.weight", a.indexer.weights_proj
        m, moe = f"{p}.mlp", layer.moe
        yield f"{m}.gate.weight", moe.gate
        if moe.tid2eid is not None:
            yield f"{m}.gate.tid2eid", moe.tid2eid
        else:
            yield f"{m}.gate.e_score_correction_bias", moe.bias
        if isinstance(moe.gate_up, Fp4Experts):
            experts = moe.gate_up
            yield f"{m}.experts.gate_up_proj", lambda e=experts: e.dequant_gate_up(dtype)
            yield f"{m}.experts.down_proj", lambda e=experts: e.dequant_down(dtype)
        else:
            yield f"{m}.experts.gate_up_proj", moe.gate_up
            yield f"{m}.experts.down_proj", moe.down
        shared_gate_up = _dense(moe.shared_gate_up, dtype)
        inter = shared_gate_up.shape[0] // 2
        yield f"{m}.shared_experts.gate_proj.weight", shared_gate_up[:inter]
        yield f"{m}.shared_experts.up_proj.weight", shared_gate_up[inter:]
        yield f"{m}.shared_experts.down_proj.weight", lambda t=moe.shared_down: _dense(t, dtype)


@torch.no_grad()
def _cast_norms_once(model: Any) -> None:
    """transformers before 5.2x multiplied its RMSNorm weight (kept in fp32) by the normed
    bf16 input and returned fp32, which its own next bf16 linear refuses; later releases
    multiply in fp32 and cast once at the end. Every release gets the later form here (the
    GPU image's transformers is older than the development machine's)."""
    import types

    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        f = x.float()
        normed = f * torch.rsqrt(f.square().mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight.float() * normed).to(x.dtype)

    for module in model.modules():
        if isinstance(module, m.DeepseekV4RMSNorm):
            module.forward = types.MethodType(forward, module)


def transformers_model(config: Any, w: ModelWeights, cfg: DeepseekV4Config, *,
                       device: str = "cuda", dtype: torch.dtype = torch.bfloat16) -> Any:
    """transformers' model on `device` in `dtype` (its fp32 modules in fp32, as
    `from_pretrained` keeps them) with `w`'s weights; every parameter and persistent buffer is
    set."""
    import transformers

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.DeepseekV4ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    _cast_norms_once(model)
    keep = model._keep_in_fp32_modules_strict
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_floating_point() and any(k in name for k in keep):
            t.data = t.data.float()
    state = dict(model.state_dict())
    seen = set()
    for name, value in transformers_tensors(w, cfg, dtype):
        tensor = value() if callable(value) else value
        target = state[name]
        if tuple(target.shape) != tuple(tensor.shape):
            raise AssertionError(f"{name}: transformers {tuple(target.shape)}, "
                                 f"ours {tuple(tensor.shape)}")
        target.copy_(tensor)
        seen.add(name)
    missing = sorted(n for n, t in state.items() if n not in seen and "mtp" not in n)
    assert not missing, f"weights not set: {missing[:8]}"
    return model
