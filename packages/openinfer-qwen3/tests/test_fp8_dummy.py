"""`--load-format dummy` for a config.json that declares FP8 (Qwen3-*-FP8's
`quantization_config`): every linear made up as e4m3 values with float32 block scales at the
real shapes. Dequantized at load by default (plain tensors in the model's dtype); with
OPENINFER_FP8_WEIGHTS=keep, held as `Fp8BlockWeight` (on the CPU here through `KEEP_DEVICES`,
the forward's `fp8_dynamic_linear` its references), decoding the same greedy tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fp8_checkpoints import FP8_CONFIG, GREEDY, PROMPTS, SPECS

import openinfer_qwen3.fp8_weights as fp8_weights
from openinfer_core import Engine, EngineConfig, GenerateRequest
from openinfer_core.testing import run_staggered, tokens_of
from openinfer_core.weights.fp8_checkpoint import Fp8BlockWeight, read_linear
from openinfer_core.weights.quantization import BlockFp8
from openinfer_core.weights.random_checkpoint import RandomCheckpoint
from openinfer_kernels.fp8_linear import dequant_fp8_blocks_ref
from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.model import Qwen3Model
from openinfer_qwen3.shapes import FP8_QUANTIZATION, write_config_folder

LINEARS = ("qkv", "o_proj", "gate_up", "down")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dummy-fp8")
    (path / "config.json").write_text(json.dumps(dict(SPECS["whole-blocks"],
                                                      quantization_config=FP8_CONFIG)))
    return path


def _engine(folder: Path) -> tuple[Engine, Qwen3Model]:
    engine = Engine(EngineConfig(model=str(folder), device="cpu", load_format="dummy"))
    assert isinstance(engine.model, Qwen3Model)
    return engine, engine.model


def _greedy(engine: Engine) -> list[list[int]]:
    requests = [GenerateRequest(f"p{i}", tuple(p), GREEDY) for i, p in enumerate(PROMPTS[:4])]
    events = run_staggered(engine, requests, arrival_step=lambda i: i)
    return [tokens_of(events[f"p{i}"]) for i in range(4)]


def test_dummy_fp8_loads_dequantized_or_kept(folder: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fp8_weights.FP8_WEIGHTS_ENV, raising=False)
    engine, model = _engine(folder)
    plain = {f: getattr(model.w.layers[0], f) for f in LINEARS}
    assert all(isinstance(w, torch.Tensor) and w.dtype == torch.float32 for w in plain.values())
    want = _greedy(engine)
    assert len({tuple(t) for t in want}) > 1

    monkeypatch.setenv(fp8_weights.FP8_WEIGHTS_ENV, "keep")
    monkeypatch.setattr(fp8_weights, "KEEP_DEVICES", frozenset({"cpu"}))
    engine, model = _engine(folder)
    cfg = model.cfg
    h, i = cfg.hidden_size, cfg.intermediate_size
    shapes = {"qkv": (cfg.q_size + 2 * cfg.kv_size, h), "o_proj": (h, cfg.q_size),
              "gate_up": (2 * i, h), "down": (h, i)}
    for field, shape in shapes.items():
        w = getattr(model.w.layers[0], field)
        assert isinstance(w, Fp8BlockWeight), field
        assert w.weight.dtype == torch.float8_e4m3fn and tuple(w.weight.shape) == shape
        assert w.scale.dtype == torch.float32
        assert tuple(w.scale.shape) == (-(-shape[0] // 128), -(-shape[1] // 128))
        # the same random model, dequantized or kept
        assert torch.equal(dequant_fp8_blocks_ref(w.weight, w.scale, dtype=torch.float32),
                           plain[field]), field
    assert model.weight_bytes < sum(t.numel() * 4 for t in plain.values()) * cfg.num_layers
    assert _greedy(engine) == want


@pytest.mark.parametrize("part", [range(64, 192), range(128, 256), range(0, 100)],
                         ids=str)
@pytest.mark.parametrize("dim", [0, 1])
def test_a_dummy_part_is_the_whole_weights_part(part: range, dim: int) -> None:
    """A tensor-parallel rank's part of a dummy FP8 linear is cut from the whole (one model
    on every rank), from its first block's start, as a stored part is read."""
    cfg = Qwen3Config.from_dict(dict(SPECS["whole-blocks"], quantization_config=FP8_CONFIG))
    ckpt = RandomCheckpoint("unused", std=0.02)
    cpu = torch.device("cpu")

    def read(p: range | None) -> Fp8BlockWeight:
        w = read_linear(ckpt, "w", shape=(256, 320), quant=cfg.quantization,
                        dtype=torch.float32, device=cpu, dim=dim, part=p)
        assert isinstance(w, Fp8BlockWeight)
        return w

    whole, cut = read(None), read(part)
    start = part.start // 128 * 128
    assert (cut.dim, cut.skip) == (dim, part.start - start)
    assert torch.equal(cut.weight.float(),
                       whole.weight.float().narrow(dim, start, part.stop - start))
    values = dequant_fp8_blocks_ref(whole.weight, whole.scale, dtype=torch.float32)
    assert 0.015 < values.std().item() < 0.025  # the config's initializer_range
    assert torch.equal(dequant_fp8_blocks_ref(cut.weight, cut.scale, dtype=torch.float32),
                       values.narrow(dim, start, part.stop - start))


def test_the_fp8_config_folder_reads_as_block_fp8(tmp_path: Path) -> None:
    """`write_config_folder(..., fp8=True)`, the benchmarks' Qwen3-*-FP8: its
    quantization_config is Qwen's and the line reads it."""
    write_config_folder("Qwen3-8B", tmp_path, fp8=True)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["quantization_config"] == FP8_QUANTIZATION
    assert Qwen3Config.from_dict(config).quantization == BlockFp8((128, 128))
    assert "quantization_config" not in json.loads(
        (write_config_folder("Qwen3-8B", tmp_path / "bf16") / "config.json").read_text())
