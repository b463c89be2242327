"""Bad input gets a clear error that names what is wrong, never a traceback from deep inside."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from engine_helpers import run_staggered
from safetensors.torch import load_file, save_file

from openinfer_core import LLM, Engine, EngineConfig, GenerateRequest, Rejected, SamplingParams
from openinfer_core.engine.scheduler import FcfsScheduler
from openinfer_core.errors import (
    InvalidParameterError,
    ModelConfigError,
    TokenizerError,
    WeightLoadError,
)
from openinfer_core.interfaces.scheduler import SchedulerConfig
from openinfer_kvcache import PagedKVManager

INDEX = "model.safetensors.index.json"


@pytest.fixture
def ckpt(tmp_path: Path, qwen3_dirs: dict[str, Path]) -> Path:
    """A private copy of a tiny checkpoint that a test may break."""
    return Path(shutil.copytree(qwen3_dirs["odd-sizes"], tmp_path / "ckpt"))


def load(path: Path) -> Engine:
    return Engine(EngineConfig(model=str(path), device="cpu"))


def edit_tensor(path: Path, name: str, new: object | None) -> None:
    """Replace (or with None, delete) tensor `name` in its shard and the index."""
    index = json.loads((path / INDEX).read_text())
    shard = path / index["weight_map"][name]
    tensors = load_file(shard)
    if new is None:
        del tensors[name]
        del index["weight_map"][name]
        (path / INDEX).write_text(json.dumps(index))
    else:
        tensors[name] = new
    save_file(tensors, shard, metadata={"format": "pt"})


def test_missing_model_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="does not exist"):
        load(tmp_path / "nowhere")


def test_missing_config(ckpt: Path) -> None:
    (ckpt / "config.json").unlink()
    with pytest.raises(ModelConfigError, match="has no config.json"):
        load(ckpt)


def test_malformed_config(ckpt: Path) -> None:
    (ckpt / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"],\n  "hidden_size": }')
    with pytest.raises(ModelConfigError, match=r"not valid JSON \(line 2, column"):
        load(ckpt)


def test_config_that_is_not_an_object(ckpt: Path) -> None:
    (ckpt / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelConfigError, match="must hold a JSON object, got list"):
        load(ckpt)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("hidden_size", None, "required field 'hidden_size' is missing"),
    ("num_hidden_layers", "two", "'num_hidden_layers' must be an integer, got 'two'"),
    ("num_key_value_heads", 2, r"num_attention_heads \(5\) must be a multiple of"),
    ("hidden_act", "gelu", "hidden_act 'gelu' is not supported"),
    ("rope_parameters", {"rope_type": "yarn", "factor": 4.0}, "rope_type 'yarn' is not supported"),
])
def test_bad_config_fields_are_named(ckpt: Path, field: str, value: object, message: str) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    if value is None:
        del config[field]
    else:
        config[field] = value
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match=message):
        load(ckpt)


def test_missing_tensor_is_named(ckpt: Path) -> None:
    edit_tensor(ckpt, "model.layers.1.mlp.down_proj.weight", None)
    with pytest.raises(WeightLoadError, match="no tensor 'model.layers.1.mlp.down_proj.weight'"):
        load(ckpt)


def test_misshaped_tensor_is_named(ckpt: Path) -> None:
    import torch

    edit_tensor(ckpt, "model.layers.0.self_attn.k_proj.weight", torch.zeros(24, 41))
    with pytest.raises(WeightLoadError, match=(
            r"'model.layers.0.self_attn.k_proj.weight' .* has shape \[24, 41\], "
            r"expected \[24, 40\]")):
        load(ckpt)


def test_missing_shard_file_is_named(ckpt: Path) -> None:
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(WeightLoadError, match=f"shard files that are missing: {shard.name}"):
        load(ckpt)


def test_no_weights_at_all(ckpt: Path) -> None:
    for f in ckpt.glob("*.safetensors*"):
        f.unlink()
    with pytest.raises(WeightLoadError, match=r"no \*.safetensors files"):
        load(ckpt)


def test_missing_tokenizer_only_matters_for_text(ckpt: Path) -> None:
    (ckpt / "tokenizer.json").unlink()
    llm = LLM(ckpt, device="cpu")
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2))
    assert len(out[0].outputs[0].token_ids) == 2  # token ids in, token ids out
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        llm.generate("hello")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"temperature": -0.5}, r"temperature: must be in \[0, 100\], got -0.5"),
    ({"top_p": 0.0}, r"top_p: must be in \(0, 1\], got 0.0"),
    ({"top_p": 1.5}, r"top_p: must be in \(0, 1\], got 1.5"),
    ({"min_p": 2}, r"min_p: must be in \[0, 1\], got 2"),
    ({"top_k": -3}, r"top_k: must be -1 \(disabled\), 0 \(disabled\) or >= 1, got -3"),
    ({"max_tokens": 0}, "max_tokens: must be >= 1, got 0"),
    ({"min_tokens": 5, "max_tokens": 4}, r"min_tokens: must be in \[0, max_tokens=4\], got 5"),
    ({"repetition_penalty": 0.0}, r"repetition_penalty: must be in \(0, 2\], got 0.0"),
    ({"frequency_penalty": 2.5}, r"frequency_penalty: must be in \[-2, 2\], got 2.5"),
    ({"presence_penalty": float("nan")}, "presence_penalty: must be a number"),
    ({"logprobs": 21}, r"logprobs: must be in \[0, 20\], got 21"),
    ({"seed": "abc"}, "seed: must be a 64-bit integer, got 'abc'"),
    ({"stop": ["ok", ""]}, "stop: stop strings must be non-empty"),
    ({"stop_token_ids": [-1]}, "stop_token_ids: must be non-negative token ids"),
])
def test_invalid_sampling_params_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message) as err:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert err.value.param == message.split(":")[0]


def test_invalid_requests() -> None:
    with pytest.raises(InvalidParameterError, match="prompt: must contain at least one token"):
        GenerateRequest("r", ())
    with pytest.raises(InvalidParameterError, match="token ids must be ints >= 0, got -4"):
        GenerateRequest("r", (1, -4))
    with pytest.raises(InvalidParameterError, match="max_num_seqs: must be an integer >= 1"):
        EngineConfig(model="x", max_num_seqs=0)
    with pytest.raises(InvalidParameterError, match="dtype: must be auto or one of"):
        EngineConfig(model="x", dtype="int3")


def test_requests_that_can_never_run_are_rejected_with_numbers(qwen3_dir: Path) -> None:
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", max_model_len=64,
                                 num_kv_blocks=5))
    requests = [
        GenerateRequest("too-long", tuple(range(60)), SamplingParams(max_tokens=10)),
        GenerateRequest("bad-id", (5, 10**7), SamplingParams(max_tokens=2)),
        GenerateRequest("fine", (1, 2, 3), SamplingParams(temperature=0, max_tokens=2)),
    ]
    events = run_staggered(engine, requests, lambda i: 0)
    assert events["too-long"] == [Rejected("too-long", (
        "prompt (60 tokens) + max_tokens (10) = 70 exceeds the maximum model length of 64 "
        "tokens"))]
    rejected = events["bad-id"]
    assert len(rejected) == 1 and isinstance(rejected[0], Rejected)
    assert "prompt token id 10000000 is out of range" in rejected[0].message
    assert len(events["fine"]) == 4  # Scheduled, 2 tokens, Finished
    assert engine.kv.num_used_blocks == 0


def test_a_request_larger_than_the_whole_kv_cache_is_rejected() -> None:
    """Start-up fits max_model_len to the cache (test_max_model_len_fit.py); the scheduler
    still refuses, with numbers, a request that a KV manager cannot hold whole."""
    scheduler = FcfsScheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64,
                                              max_model_len=64), PagedKVManager(4, 16))
    scheduler.add(GenerateRequest("too-big", tuple(range(40)), SamplingParams(max_tokens=20)))
    assert scheduler.schedule().events == [Rejected("too-big", (
        "request needs 4 KV blocks (60 tokens) but the whole KV cache holds 3 blocks of 16 "
        "tokens"))]
