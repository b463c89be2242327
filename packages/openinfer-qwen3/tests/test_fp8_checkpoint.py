"""Qwen3 checkpoints in HF's block-scaled FP8 layout (Qwen3-*-FP8): config.json's
`quantization_config` {quant_method fp8, e4m3, dynamic activations, 128 x 128 blocks}, each
linear's e4m3 `weight` beside a float32 `weight_scale_inv` per block, everything else bf16.

The tests quantize random weights themselves (scale = block amax / 448, e4m3 rounding) and
write, beside the FP8 checkpoint, a plain one holding the same weights dequantized: loading
the first must give exactly the tensors of the second, whole or a tensor-parallel rank's
slices (shard boundaries inside a scale block included), and the engine must decode the same
greedy tokens from both. Settings the Qwen3 line does not implement are refused at start-up."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from fp8_checkpoints import (
    BLOCK,
    FP8_CONFIG,
    GREEDY,
    PROMPTS,
    SPECS,
    write_folder,
    write_pair,
)

from openinfer_core import Engine, EngineConfig, GenerateRequest
from openinfer_core.distributed import TensorParallelModel
from openinfer_core.errors import ModelConfigError, WeightLoadError
from openinfer_core.testing import run_staggered, tokens_of
from openinfer_core.weights.checkpoint import Checkpoint
from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.weights import Qwen3Shard, Qwen3Weights, load_weights


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    return {name: write_pair(config, tmp_path_factory.mktemp(name))
            for name, config in SPECS.items()}


@pytest.fixture(scope="module", params=sorted(SPECS))
def pair(request: pytest.FixtureRequest,
         pairs: dict[str, tuple[Path, Path]]) -> tuple[str, Path, Path]:
    return (request.param, *pairs[request.param])


def _tensors(w: Qwen3Weights) -> dict[str, torch.Tensor]:
    out = {"embed": w.embed, "final_norm": w.final_norm, "lm_head": w.lm_head}
    for n, layer in enumerate(w.layers):
        for field in ("input_norm", "qkv", "q_norm", "k_norm", "o_proj", "post_norm",
                      "gate_up", "down"):
            out[f"{n}.{field}"] = getattr(layer, field)
    return out


@pytest.mark.parametrize("rank_of", [None, (0, 2), (1, 2)], ids=["whole", "tp2-r0", "tp2-r1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_loaded_weights_are_the_dequantized_ones(pair: tuple[str, Path, Path],
                                                 rank_of: tuple[int, int] | None,
                                                 dtype: torch.dtype) -> None:
    """Every tensor equals the plain checkpoint's exactly (bf16: the fp32 product rounded
    once), and a rank reads its slices, not the whole linears."""
    name, fp8_dir, plain_dir = pair
    cfg = Qwen3Config.from_dict(json.loads((fp8_dir / "config.json").read_text()))
    assert cfg.quantization is not None and cfg.quantization.block == (BLOCK, BLOCK)
    shard = None if rank_of is None else Qwen3Shard.of(cfg, *rank_of)
    cpu = torch.device("cpu")
    ckpt = Checkpoint(fp8_dir)
    got = _tensors(load_weights(ckpt, cfg, dtype=dtype, device=cpu, shard=shard))
    want = _tensors(load_weights(Checkpoint(plain_dir), cfg, dtype=dtype, device=cpu,
                                 shard=shard))
    for key, tensor in want.items():
        assert got[key].dtype == dtype and got[key].shape == tensor.shape, f"{name}: {key}"
        assert torch.equal(got[key], tensor), f"{name}: {key}"
    if shard is not None:
        whole = Checkpoint(fp8_dir)
        load_weights(whole, cfg, dtype=dtype, device=cpu)
        assert ckpt.bytes_read < 0.7 * whole.bytes_read, name


def _greedy(engine: Engine) -> list[list[int]]:
    requests = [GenerateRequest(f"p{i}", tuple(p), GREEDY) for i, p in enumerate(PROMPTS)]
    events = run_staggered(engine, requests, arrival_step=lambda i: i)
    return [tokens_of(events[f"p{i}"]) for i in range(len(PROMPTS))]


@pytest.fixture(scope="module")
def plain_tokens(pair: tuple[str, Path, Path]) -> list[list[int]]:
    tokens = _greedy(Engine(EngineConfig(model=str(pair[2]), device="cpu")))
    assert all(len(t) == GREEDY.max_tokens for t in tokens)
    assert len({tuple(t) for t in tokens}) > 4, "prompts too alike to tell models apart"
    return tokens


def test_engine_decodes_the_dequantized_models_tokens(pair: tuple[str, Path, Path],
                                                      plain_tokens: list[list[int]]) -> None:
    engine = Engine(EngineConfig(model=str(pair[1]), device="cpu"))
    assert _greedy(engine) == plain_tokens


def test_two_ranks_decode_the_dequantized_models_tokens(pair: tuple[str, Path, Path],
                                                        plain_tokens: list[list[int]]) -> None:
    """Two ranks (gloo), each dequantizing only its slices: the second rank's start inside
    scale blocks in the partial-blocks model."""
    engine = Engine(EngineConfig(model=str(pair[1]), device="cpu", tensor_parallel_size=2))
    assert isinstance(engine.model, TensorParallelModel)
    try:
        assert _greedy(engine) == plain_tokens
    finally:
        engine.model.close()


REFUSED = {
    "awq": ({"quant_method": "awq", "bits": 4},
            re.escape("quantization_config.quant_method 'awq' is not supported by the qwen3 "
                      "model line (supported: fp8 with weight_block_size [128, 128], fp8 with "
                      "per-tensor or per-channel weight scales, compressed-tensors FP8 with "
                      "per-channel or per-tensor weight scales, each with dynamic or no "
                      "activation quantization; or no quantization_config)")),
    "block-64": (dict(FP8_CONFIG, weight_block_size=[64, 64]),
                 re.escape("weight_block_size [64, 64] is not supported")),
    "static": (dict(FP8_CONFIG, activation_scheme="static"),
               "activation_scheme 'static' is not supported"),
    "e5m2": (dict(FP8_CONFIG, fmt="e5m2"), "fmt 'e5m2' is not supported"),
    "kv-cache-scales": (dict(FP8_CONFIG, kv_cache_scheme={"num_bits": 8}),
                        "quantization_config with 'kv_cache_scheme' is not supported"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_quantization_the_line_does_not_implement_is_refused(case: str) -> None:
    quant, message = REFUSED[case]
    config = dict(SPECS["whole-blocks"], quantization_config=quant)
    with pytest.raises(ModelConfigError, match=message):
        Qwen3Config.from_dict(config)


def test_refused_at_engine_start(tmp_path: Path) -> None:
    config = dict(SPECS["whole-blocks"], quantization_config=REFUSED["awq"][0])
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match="'awq' is not supported by the qwen3"):
        Engine(EngineConfig(model=str(tmp_path), device="cpu"))


def _edited(src: Path, dest: Path, edit: Callable[[dict[str, torch.Tensor]], None],
            quant: dict[str, Any] | None = FP8_CONFIG) -> Path:
    """A copy of checkpoint `src` with its tensors changed by `edit` (and its config's
    quantization_config set to `quant`)."""
    ckpt = Checkpoint(src)
    tensors = {n: ckpt.get(n) for n in sorted(ckpt.names())}
    edit(tensors)
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config", None)
    return write_folder(dest, config, tensors, quant)


LAYER0 = "model.layers.0.self_attn."
CONTRADICTIONS: dict[str, tuple[Callable[[dict[str, torch.Tensor]], None],
                                dict[str, Any] | None, str]] = {
    "scale-missing": (lambda t: t.pop(LAYER0 + "k_proj.weight_scale_inv"), FP8_CONFIG,
                      f"tensor '{LAYER0}k_proj.weight' .* is stored as torch.float8_e4m3fn "
                      "without block scales"),
    "no-quantization-config": (lambda t: None, None,
                               "has FP8 block scales .* but its config.json declares no "
                               "quantization_config"),
    "scale-shape": (lambda t: t.update({LAYER0 + "o_proj.weight_scale_inv": torch.ones(1, 1)}),
                    FP8_CONFIG, f"tensor '{LAYER0}o_proj.weight_scale_inv' .* has shape "
                    r"\[1, 1\], expected \[2, 2\]"),
    "weight-not-fp8": (lambda t: t.update({LAYER0 + "q_proj.weight":
                                           t[LAYER0 + "q_proj.weight"].to(torch.bfloat16)}),
                       FP8_CONFIG, f"tensor '{LAYER0}q_proj.weight' is stored as torch.bfloat16 "
                       "beside block scales"),
    "fp8-norm": (lambda t: t.update({"model.norm.weight":
                                     t["model.norm.weight"].to(torch.float8_e4m3fn)}),
                 FP8_CONFIG, "tensor 'model.norm.weight' .* is stored as torch.float8_e4m3fn"),
}


@pytest.mark.parametrize("case", sorted(CONTRADICTIONS))
def test_tensors_that_contradict_the_config_are_refused(
        pairs: dict[str, tuple[Path, Path]], case: str, tmp_path: Path) -> None:
    edit, quant, message = CONTRADICTIONS[case]
    path = _edited(pairs["whole-blocks"][0], tmp_path / case, edit, quant)
    with pytest.raises(WeightLoadError, match=message):
        Engine(EngineConfig(model=str(path), device="cpu"))
