"""Whole safetensors files read through chunked buffers (`weights/shard_reader.py`): the same
tensors as safetensors' own loader for any chunk size, and clear errors for broken files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from openinfer_core.errors import WeightLoadError
from openinfer_core.weights import checkpoint
from openinfer_core.weights.checkpoint import Checkpoint
from openinfer_core.weights.shard_reader import read_shard


def mixed_file(path: Path) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "a.weight": torch.randn((33, 17), generator=g).to(torch.bfloat16),
        "b.bias": torch.randn(5, generator=g),
        "c.empty": torch.zeros((0, 4)),
        "d.ids": torch.arange(11, dtype=torch.int64),
        "e.half": torch.randn((3, 3, 3), generator=g).to(torch.float16),
        "f.fp8": torch.randn(9, generator=g).to(torch.float8_e4m3fn),
    }
    save_file(tensors, str(path))
    return tensors


@pytest.mark.parametrize("chunk", [7, 1000, 1 << 20])
def test_every_tensor_matches_safetensors_own_loader(tmp_path: Path, chunk: int) -> None:
    path = tmp_path / "model.safetensors"
    mixed_file(path)
    want = load_file(str(path))
    got = read_shard(path, torch.device("cpu"), chunk_bytes=chunk)
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name].view(torch.uint8), tensor.view(torch.uint8)), name


def test_a_truncated_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    mixed_file(path)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(WeightLoadError, match="truncated"):
        read_shard(path, torch.device("cpu"))


def test_a_file_that_is_not_safetensors_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(WeightLoadError, match="not JSON"):
        read_shard(path, torch.device("cpu"))


def test_checkpoint_reads_through_whole_shards_when_asked(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    want = mixed_file(tmp_path / "model.safetensors")
    monkeypatch.setattr(checkpoint, "WHOLE_SHARDS", True)
    ckpt = Checkpoint(tmp_path)
    got = ckpt.get("a.weight", shape=(33, 17), dtype=torch.float32)
    assert torch.equal(got, want["a.weight"].float())
    assert ckpt.get("d.ids").tolist() == list(range(11))
    assert torch.equal(ckpt.get("a.weight"), want["a.weight"])  # again: from the memory map
    with pytest.raises(WeightLoadError, match="expected"):
        ckpt.get("b.bias", shape=(6,))
    ckpt.close()


def test_a_model_loads_the_same_weights_either_way(qwen3_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from openinfer_core.engine.config import EngineConfig
    from openinfer_core.engine.engine import Engine

    def weights() -> list[torch.Tensor]:
        w = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", num_kv_blocks=8)).model.w
        layers = [t for layer in w.layers for t in (layer.qkv, layer.gate_up, layer.down)]
        return [w.embed, w.lm_head, w.final_norm, *layers]

    mapped = weights()
    monkeypatch.setattr(checkpoint, "WHOLE_SHARDS", True)
    assert all(torch.equal(a, b) for a, b in zip(mapped, weights(), strict=True))
