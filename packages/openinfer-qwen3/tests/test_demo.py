from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from openinfer_core.plugins import PluginManager
from openinfer_core.registry import import_target
from openinfer_core.weights.checkpoint import Checkpoint
from openinfer_qwen3 import demo, plugin, random_weights
from openinfer_qwen3.config import Qwen3Config


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One openinfer cache for the module, so the tokenizer is converted once."""
    return tmp_path_factory.mktemp("openinfer-cache")


@pytest.fixture(autouse=True)
def _cache_env(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(cache))


@pytest.fixture(scope="module")
def demo_dir(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENINFER_CACHE_DIR", str(cache))
        return demo.write_demo_checkpoint(tmp_path_factory.mktemp("demo"))


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                out[name] = handle.get_tensor(name)
    return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_demo_folder_is_a_complete_checkpoint(demo_dir: Path) -> None:
    names = sorted(p.name for p in demo_dir.iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors",
                     "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((demo_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["openinfer_demo"] is True
    assert config["vocab_size"] == 151936
    generation = json.loads((demo_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [151645, 151643]


def test_demo_tensors_have_the_huggingface_names_and_shapes(demo_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = json.loads((demo_dir / "config.json").read_text())
    hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**config))
    expected = {k: tuple(v.shape) for k, v in hf.state_dict().items()}
    expected.pop("lm_head.weight")  # tied: transformers does not save it either
    tensors = _tensors(demo_dir)
    assert {k: tuple(v.shape) for k, v in tensors.items()} == expected
    assert all(t.dtype == torch.float32 for t in tensors.values())


def test_demo_weights_have_the_intended_spread(demo_dir: Path) -> None:
    tensors = _tensors(demo_dir)
    embed = tensors["model.embed_tokens.weight"]
    assert abs(embed.std().item() - demo.DEMO_STD) < 0.01
    norm = tensors["model.norm.weight"]
    assert abs(norm.mean().item() - 1.0) < 0.1
    assert 0.02 < norm.std().item() < 0.3


def test_demo_weights_are_the_same_on_every_write(demo_dir: Path, tmp_path: Path) -> None:
    again = demo.write_demo_checkpoint(tmp_path / "again")
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert _sha(again / name) == _sha(demo_dir / name)


def test_demo_checkpoint_is_written_once_and_cached(cache: Path) -> None:
    first = demo.demo_checkpoint()
    assert first.parent == cache
    assert first.name.startswith("demo-qwen3-")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert demo.demo_checkpoint() == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temp folders left


def test_plugin_registers_the_demo() -> None:
    pm = PluginManager(autoload=False, plugins=[plugin])
    entry = pm.registries.models.get("qwen3")
    assert import_target(entry.meta["demo"]) is demo.demo_checkpoint


def test_demo_generates_text_that_depends_on_the_prompt(demo_dir: Path) -> None:
    from openinfer_core import LLM, SamplingParams

    llm = LLM(str(demo_dir), device="cpu", num_kv_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    a, b = llm.generate(["The capital of France is", "def fibonacci(n):"], params)
    assert len(a.outputs[0].token_ids) == 8
    assert a.outputs[0].token_ids != b.outputs[0].token_ids


def _qwen3_config(**overrides: object) -> dict[str, object]:
    config = {k: v for k, v in demo.DEMO_CONFIG.items() if k != "openinfer_demo"}
    config.update(vocab_size=1000, torch_dtype="bfloat16", initializer_range=0.02,
                  tie_word_embeddings=False, attention_bias=True)
    config.update(overrides)
    return config


def test_random_weights_follow_the_config(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    config = _qwen3_config()
    (src / "config.json").write_text(json.dumps(config))
    dest = tmp_path / "dest"
    dest.mkdir()
    random_weights.write_random_weights(src, dest)
    tensors = _tensors(dest)
    shapes = random_weights.tensor_shapes(Qwen3Config.from_dict(config))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == shapes
    assert "lm_head.weight" in tensors and "model.layers.0.self_attn.q_proj.bias" in tensors
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert abs(tensors["lm_head.weight"].float().std().item() - 0.02) < 0.002


def test_random_weights_shard_large_checkpoints(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random_weights, "MAX_SHARD_BYTES", 200_000)
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    config = _qwen3_config()
    (src / "config.json").write_text(json.dumps(config))
    random_weights.write_random_weights(src, dest)
    index = json.loads((dest / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    ckpt = Checkpoint(dest)
    try:
        cfg = Qwen3Config.from_dict(config)
        for name, shape in random_weights.tensor_shapes(cfg).items():
            assert tuple(ckpt.get(name, shape=shape, dtype=torch.float32,
                                  device=torch.device("cpu")).shape) == shape
    finally:
        ckpt.close()
    total = sum(t.numel() * t.element_size() for t in _tensors(dest).values())
    assert index["metadata"]["total_size"] == total


def test_random_weights_refuse_an_unknown_dtype(tmp_path: Path) -> None:
    from openinfer_core.errors import ModelConfigError

    (tmp_path / "config.json").write_text(json.dumps(_qwen3_config(torch_dtype="int4")))
    with pytest.raises(ModelConfigError, match="torch_dtype 'int4'"):
        random_weights.write_random_weights(tmp_path, tmp_path)
