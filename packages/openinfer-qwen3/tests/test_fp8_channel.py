"""Per-channel (and per-tensor) scaled FP8 Qwen3 checkpoints: llm-compressor's
compressed-tensors FP8 (FP8_DYNAMIC: e4m3 `weight` beside a `weight_scale` [O, 1] per output
channel, activations quantized per token at run time), and HF `quant_method: fp8` without
`weight_block_size` (one `weight_scale` per tensor, as vLLM reads it). The FP8 kernels read
128 x 128 block scales only, so these load dequantized to the model's dtype (a log line says
so): exactly the tensors of a plain checkpoint of the dequantized weights, whole or a rank's
slices. Settings beyond that are refused at start-up."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from fp8_checkpoints import E4M3_MAX, SPECS, write_folder

from openinfer_core import Engine, EngineConfig
from openinfer_core.errors import ModelConfigError
from openinfer_core.weights.checkpoint import Checkpoint
from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.random_weights import tensor_shapes
from openinfer_qwen3.weights import Qwen3Shard, load_weights

GROUP: dict[str, Any] = {
    "targets": ["Linear"],
    "weights": {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
                "strategy": "channel", "group_size": None, "block_structure": None,
                "observer": "minmax", "observer_kwargs": {}, "actorder": None},
    "input_activations": {"num_bits": 8, "type": "float", "symmetric": True,
                          "dynamic": True, "strategy": "token", "observer": None},
    "output_activations": None,
}
# What llm-compressor writes for its FP8_DYNAMIC scheme (RedHatAI's *-FP8-dynamic).
COMPRESSED_TENSORS: dict[str, Any] = {
    "quant_method": "compressed-tensors", "format": "float-quantized",
    "config_groups": {"group_0": GROUP}, "ignore": ["lm_head"], "kv_cache_scheme": None,
    "quantization_status": "compressed", "global_compression_ratio": None,
    "sparsity_config": {}, "version": "0.9.1"}
PER_TENSOR = {"quant_method": "fp8", "activation_scheme": "dynamic"}


def _write(root: Path, quant: dict[str, Any], per_tensor: bool) -> tuple[Path, Path]:
    """(the FP8 checkpoint, a plain fp32 one of its weights dequantized)."""
    config = SPECS["partial-blocks"]
    gen = torch.Generator().manual_seed(5)
    fp8: dict[str, torch.Tensor] = {}
    plain: dict[str, torch.Tensor] = {}
    for name, shape in tensor_shapes(Qwen3Config.from_dict(config)).items():
        values = torch.randn(shape, generator=gen)
        values = 1.0 + 0.2 * values if name.endswith("norm.weight") else 0.25 * values
        if name.endswith("_proj.weight"):
            amax = values.abs().amax() if per_tensor else values.abs().amax(1, keepdim=True)
            scale = amax / E4M3_MAX
            q = (values / scale).to(torch.float8_e4m3fn)
            fp8[name] = q
            fp8[name.removesuffix("weight") + "weight_scale"] = (
                scale.reshape(()) if per_tensor else scale.to(torch.bfloat16))
            plain[name] = q.float() * fp8[name.removesuffix("weight") + "weight_scale"].float()
        else:
            fp8[name] = values.to(torch.bfloat16)
            plain[name] = fp8[name].float()
    return (write_folder(root / "fp8", config, fp8, quant),
            write_folder(root / "plain", config, plain, None))


@pytest.mark.parametrize("scheme", ["compressed-tensors", "fp8-per-tensor"])
@pytest.mark.parametrize("rank_of", [None, (1, 2)], ids=["whole", "tp2-r1"])
def test_channel_fp8_loads_dequantized(scheme: str, rank_of: tuple[int, int] | None,
                                       tmp_path: Path, caplog: pytest.LogCaptureFixture
                                       ) -> None:
    per_tensor = scheme == "fp8-per-tensor"
    fp8, plain = _write(tmp_path, PER_TENSOR if per_tensor else COMPRESSED_TENSORS,
                        per_tensor)
    cfg = Qwen3Config.from_dict(json.loads((fp8 / "config.json").read_text()))
    shard = None if rank_of is None else Qwen3Shard.of(cfg, *rank_of)
    cpu = torch.device("cpu")
    with caplog.at_level(logging.INFO, logger="openinfer.qwen3"):
        got = load_weights(Checkpoint(fp8), cfg, dtype=torch.float32, device=cpu, shard=shard,
                           keep_fp8=True)
    assert f"per-channel FP8 linears ({scheme.removesuffix('-per-tensor')}) dequantized to " \
        "torch.float32 at load" in caplog.text
    plain_cfg = Qwen3Config.from_dict(json.loads((plain / "config.json").read_text()))
    want = load_weights(Checkpoint(plain), plain_cfg, dtype=torch.float32, device=cpu,
                        shard=shard)
    for g, w in zip(got.layers, want.layers, strict=True):
        for field in ("qkv", "o_proj", "gate_up", "down", "input_norm"):
            assert torch.equal(getattr(g, field), getattr(w, field)), field
    assert torch.equal(got.lm_head, want.lm_head)


def test_engine_serves_a_channel_fp8_checkpoint(tmp_path: Path) -> None:
    fp8, _ = _write(tmp_path, COMPRESSED_TENSORS, False)
    engine = Engine(EngineConfig(model=str(fp8), device="cpu", quantization="fp8"))
    assert engine.model_info.max_model_len > 0


def _group(**changes: Any) -> dict[str, Any]:
    return dict(COMPRESSED_TENSORS, config_groups={"group_0": {**GROUP, **changes}})


REFUSED = {
    "int4": (_group(weights={**GROUP["weights"], "type": "int", "num_bits": 4}),
             "compressed-tensors config group 'group_0' weights.num_bits 4"),
    "group-strategy": (_group(weights={**GROUP["weights"], "strategy": "group"}),
                       "weights.strategy 'group'"),
    "static-activations": (_group(input_activations={**GROUP["input_activations"],
                                                     "dynamic": False}),
                           "input_activations .* .only dynamic FP8 per token or tensor."),
    "kv-cache-scales": (dict(COMPRESSED_TENSORS, kv_cache_scheme={"num_bits": 8}),
                        "compressed-tensors kv_cache_scheme"),
    "pack-quantized": (dict(COMPRESSED_TENSORS, format="pack-quantized"),
                       "format 'pack-quantized'"),
    "fp8-static": (dict(PER_TENSOR, activation_scheme="static"),
                   "activation_scheme 'static' is not supported"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_channel_settings_the_line_does_not_implement_are_refused(case: str) -> None:
    quant, message = REFUSED[case]
    with pytest.raises(ModelConfigError, match=message):
        Qwen3Config.from_dict(dict(SPECS["whole-blocks"], quantization_config=quant))
