"""`--quantization fp8` on Qwen3: an unquantized checkpoint's linears (q/k/v, o, gate/up,
down; not the embedding, LM head or norms) quantized at load to 128 x 128 block-scaled e4m3,
each fused linear as it is built: kept FP8 (`Fp8BlockWeight`) where FP8 is kept, else
quantized and dequantized again. The result is the FP8 checkpoint of the same weights; on an
FP8 checkpoint the flag changes nothing; lines that do not quantize at load refuse it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fp8_checkpoints import GREEDY, PROMPTS
from fp8_online_checkpoints import write_bf16_and_fp8

import openinfer_qwen3.fp8_weights as fp8_weights
from openinfer_core import Engine, EngineConfig, GenerateRequest
from openinfer_core.errors import ModelConfigError
from openinfer_core.plugins import get_plugin_manager
from openinfer_core.startup.model_loader import load_model
from openinfer_core.testing import run_staggered, tokens_of
from openinfer_core.weights.checkpoint import Checkpoint
from openinfer_core.weights.fp8_checkpoint import Fp8BlockWeight
from openinfer_core.weights.fp8_quantize import quantize_block_fp8
from openinfer_kernels.fp8_linear import dequant_fp8_blocks_ref
from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.model import Qwen3Model
from openinfer_qwen3.weights import Qwen3Shard, Qwen3Weights, load_weights

LINEARS = ("qkv", "o_proj", "gate_up", "down")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_bf16_and_fp8(tmp_path_factory.mktemp("online"))


def _load(folder: Path, *, shard: tuple[int, int] | None = None, keep: bool = False,
          quantize: bool = False, dtype: torch.dtype = torch.float32) -> Qwen3Weights:
    cfg = Qwen3Config.from_dict(json.loads((folder / "config.json").read_text()))
    part = None if shard is None else Qwen3Shard.of(cfg, *shard)
    return load_weights(Checkpoint(folder), cfg, dtype=dtype, device=CPU, shard=part,
                        keep_fp8=keep, quantize=quantize)


@pytest.mark.parametrize("shard", [None, (1, 2)], ids=["whole", "tp2-r1"])
def test_linears_are_quantized_as_they_load(folders: tuple[Path, Path],
                                            shard: tuple[int, int] | None) -> None:
    """Kept: each linear is quantize_block_fp8 of the plain one (the rank's part); not kept:
    that, dequantized to the model's dtype; the rest is the plain checkpoint's."""
    bf16 = folders[0]
    plain = _load(bf16, shard=shard)
    kept = _load(bf16, shard=shard, keep=True, quantize=True)
    fake = _load(bf16, shard=shard, quantize=True, dtype=torch.bfloat16)
    for p_layer, k_layer, f_layer in zip(plain.layers, kept.layers, fake.layers, strict=True):
        for field in LINEARS:
            want = quantize_block_fp8(getattr(p_layer, field))
            got = getattr(k_layer, field)
            assert isinstance(got, Fp8BlockWeight), field
            assert torch.equal(got.weight.view(torch.uint8), want.weight.view(torch.uint8))
            assert torch.equal(got.scale, want.scale) and got.block == (128, 128)
            assert torch.equal(getattr(f_layer, field),
                               dequant_fp8_blocks_ref(want.weight, want.scale, 128,
                                                      torch.bfloat16)), field
        assert torch.equal(p_layer.input_norm, k_layer.input_norm)
    assert torch.equal(plain.embed, kept.embed) and torch.equal(plain.lm_head, kept.lm_head)
    assert kept.decode_bytes() < 0.5 * plain.decode_bytes() + plain.embed.numel() * 4


def test_online_fp8_is_the_fp8_checkpoint_of_the_same_weights(folders: tuple[Path, Path]
                                                              ) -> None:
    """The bf16 checkpoint quantized at load holds the tensors of its FP8 twin, quantized
    offline by the formula of HF's FP8 checkpoints, and the engine decodes the same tokens."""
    bf16, fp8 = folders
    online = _load(bf16, keep=True, quantize=True)
    stored = _load(fp8, keep=True)
    for o_layer, s_layer in zip(online.layers, stored.layers, strict=True):
        for field in LINEARS:
            o, s = getattr(o_layer, field), getattr(s_layer, field)
            assert isinstance(o, Fp8BlockWeight) and isinstance(s, Fp8BlockWeight)
            assert torch.equal(o.weight.view(torch.uint8), s.weight.view(torch.uint8))
            assert torch.equal(o.scale, s.scale)
    assert _greedy(Engine(EngineConfig(model=str(bf16), device="cpu", quantization="fp8"))) \
        == _greedy(Engine(EngineConfig(model=str(fp8), device="cpu")))


def _greedy(engine: Engine) -> list[list[int]]:
    requests = [GenerateRequest(f"p{i}", tuple(p), GREEDY) for i, p in enumerate(PROMPTS[:4])]
    events = run_staggered(engine, requests, arrival_step=lambda i: i)
    return [tokens_of(events[f"p{i}"]) for i in range(4)]


def test_engine_keeps_fp8_where_fp8_is_kept(folders: tuple[Path, Path],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """On a device that keeps FP8, `--quantization fp8` keeps it without
    OPENINFER_FP8_WEIGHTS; `dequantize` there still dequantizes; the CPU dequantizes."""
    monkeypatch.delenv(fp8_weights.FP8_WEIGHTS_ENV, raising=False)
    engine = Engine(EngineConfig(model=str(folders[0]), device="cpu", quantization="fp8"))
    assert isinstance(engine.model, Qwen3Model)
    assert isinstance(engine.model.w.layers[0].qkv, torch.Tensor)
    monkeypatch.setattr(fp8_weights, "KEEP_DEVICES", frozenset({"cpu", "cuda"}))
    engine = Engine(EngineConfig(model=str(folders[0]), device="cpu", quantization="fp8"))
    assert isinstance(engine.model, Qwen3Model)
    assert all(isinstance(getattr(engine.model.w.layers[0], f), Fp8BlockWeight)
               for f in LINEARS)
    monkeypatch.setenv(fp8_weights.FP8_WEIGHTS_ENV, "dequantize")
    engine = Engine(EngineConfig(model=str(folders[0]), device="cpu", quantization="fp8"))
    assert isinstance(engine.model, Qwen3Model)
    assert isinstance(engine.model.w.layers[0].qkv, torch.Tensor)


def test_fp8_checkpoint_with_quantization_fp8_is_unchanged(folders: tuple[Path, Path]) -> None:
    fp8 = folders[1]
    assert _greedy(Engine(EngineConfig(model=str(fp8), device="cpu", quantization="fp8"))) \
        == _greedy(Engine(EngineConfig(model=str(fp8), device="cpu")))


def test_another_quantization_config_is_refused(folders: tuple[Path, Path],
                                                tmp_path: Path) -> None:
    config = json.loads((folders[0] / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match="declares quantization_config.quant_method "
                                               "'gptq': leave out --quantization"):
        Engine(EngineConfig(model=str(tmp_path), device="cpu", quantization="fp8"))


def test_deepseek_v4_refuses_online_quantization() -> None:
    """Its checkpoints are FP8 / FP4 already: the line quantizes nothing at load."""
    from openinfer_deepseek_v4.demo import demo_checkpoint

    with pytest.raises(ModelConfigError, match="model line 'deepseek-v4' does not quantize "
                                               "weights at load: leave out --quantization fp8"):
        load_model(EngineConfig(model=str(demo_checkpoint()), device="cpu",
                                quantization="fp8"), get_plugin_manager())
