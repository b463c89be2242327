"""`--kv-cache-dtype fp8` end to end on CPU (the torch reference path): e4m3 blocks of half a
bf16 block's bytes, so twice the blocks for one budget; logprobs close to the fp32 KV cache's;
per-layer scales read from the checkpoint under vLLM's names; offload round trips of e4m3
blocks; lines without an FP8 KV cache refuse it."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from engine_helpers import prompt_logits, run_staggered, tokens_of
from safetensors.torch import save_file

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.errors import ModelConfigError, WeightLoadError
from openinfer_core.events import Scheduled
from openinfer_core.interfaces.capabilities import supports_fp8_kv_cache
from openinfer_core.params import SamplingParams
from openinfer_core.plugins import PluginManager
from openinfer_core.request import GenerateRequest
from openinfer_core.startup.memory_budget import kv_blocks
from openinfer_core.startup.model_loader import load_model
from openinfer_core.weights.checkpoint import Checkpoint
from openinfer_core.weights.kv_scales import read_kv_scales
from openinfer_deepseek_v4.demo import DEMO_CONFIG
from openinfer_deepseek_v4.model_line import DeepseekV4ModelLine
from openinfer_qwen3.model_line import Qwen3ModelLine

PROMPTS = [[random.Random(i).randrange(1, 1000) for _ in range(40)] for i in range(8)]
GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


def with_scales(src: Path, dest: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """A copy of checkpoint `src` with `tensors` added in a file of their own."""
    shutil.copytree(src, dest)
    index_path = dest / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    save_file(tensors, dest / "kv-scales.safetensors")
    index["weight_map"].update({name: "kv-scales.safetensors" for name in tensors})
    index_path.write_text(json.dumps(index))
    return dest


def scale_tensors(k: float, v: float, layers: int = 2,
                  names: tuple[str, str] = ("k_scale", "v_scale")) -> dict[str, torch.Tensor]:
    return {f"model.layers.{n}.self_attn.{name}": torch.tensor(value)
            for n in range(layers) for name, value in zip(names, (k, v), strict=True)}


def run(model: Path, kv_cache_dtype: str) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Each prompt's log-probabilities at every position, and its 3 greedy tokens."""
    e = Engine(EngineConfig(model=str(model), device="cpu", kv_cache_dtype=kv_cache_dtype,
                            num_kv_blocks=64))
    try:
        logprobs = [torch.log_softmax(prompt_logits(e, p), -1) for p in PROMPTS]
        requests = [GenerateRequest(f"r{i}", tuple(p), GREEDY) for i, p in enumerate(PROMPTS)]
        events = run_staggered(e, requests, lambda i: 0)
        return logprobs, [tokens_of(events[f"r{i}"]) for i in range(len(PROMPTS))]
    finally:
        e.close()


@pytest.fixture(scope="module")
def fp32_kv(qwen3_dir: Path) -> tuple[list[torch.Tensor], list[list[int]]]:
    return run(qwen3_dir, "auto")


@pytest.fixture(scope="module")
def fp8_kv(qwen3_dir: Path) -> tuple[list[torch.Tensor], list[list[int]]]:
    return run(qwen3_dir, "fp8")


def mean_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return float(torch.cat([(x - y).abs().flatten() for x, y in zip(a, b, strict=True)]).mean())


def test_logprobs_stay_close_to_the_fp32_kv_cache(fp32_kv, fp8_kv) -> None:
    # Every cached key and value moves by at most half an e4m3 step, 2^-4 of itself (less
    # below 2^-6). These tiny models are built to amplify errors (initializer_range 0.25, norm
    # weights spread: logits tens of nats apart), and there the 2^-4 moves became a mean
    # |delta logprob| of 0.09 nats and top-1 agreement of 87% when measured; a scale applied
    # twice or not at all, or one page read as another, costs whole nats. Bounds: 2.5x and
    # 10 points of margin on the measurement. The drift is not zero: the pages are e4m3.
    drift = mean_abs_diff(fp32_kv[0], fp8_kv[0])
    assert 0.01 < drift < 0.25
    agree = torch.cat([(x.argmax(-1) == y.argmax(-1)).float()
                       for x, y in zip(fp32_kv[0], fp8_kv[0], strict=True)]).mean()
    assert agree > 0.75
    # The first greedy token is the last prompt position's top-1: 7 of 8 agreed when measured,
    # whole 3-token outputs 6 of 8.
    assert sum(a[0] == b[0] for a, b in zip(fp32_kv[1], fp8_kv[1], strict=True)) >= 6
    assert sum(a == b for a, b in zip(fp32_kv[1], fp8_kv[1], strict=True)) >= 5


def test_checkpoint_scales_are_read_and_applied(qwen3_dir: Path, tmp_path: Path,
                                                fp8_kv) -> None:
    # Powers of two: k / 0.5 and v / 4 round to the same e4m3 mantissas as k and v, so the
    # logprobs match the unscaled run's but for values near the subnormal and saturation
    # ends (measured: 0.001 nats mean). Ignored scales would match exactly; misapplied ones
    # (a scale squared, k_scale on v) would move them by tenths of nats.
    scaled = with_scales(qwen3_dir, tmp_path / "scaled", scale_tensors(0.5, 4.0))
    logprobs, _ = run(scaled, "fp8")
    assert 0.0 < mean_abs_diff(logprobs, fp8_kv[0]) < 0.01


@pytest.mark.parametrize("names", [("k_scale", "v_scale"), ("k_proj.k_scale", "v_proj.v_scale"),
                                   ("k_proj.output_scale", "v_proj.output_scale")],
                         ids=["vllm", "modelopt", "compressed-tensors"])
def test_scale_names_vllm_reads(qwen3_dir: Path, tmp_path: Path,
                                names: tuple[str, str]) -> None:
    folder = with_scales(qwen3_dir, tmp_path / "ckpt", scale_tensors(0.25, 3.0, names=names))
    prefixes = [f"model.layers.{n}.self_attn." for n in range(2)]
    for layer in read_kv_scales(Checkpoint(folder), prefixes, 2):
        assert layer.per_tensor == (0.25, 3.0)  # one number per layer: every head's
        assert layer.k.tolist() == [0.25, 0.25] and layer.v.tolist() == [3.0, 3.0]
    # Without scales: 1.0, as vLLM.
    assert [s.per_tensor for s in read_kv_scales(Checkpoint(qwen3_dir), prefixes, 2)] == [
        (1.0, 1.0)] * 2


@pytest.mark.parametrize(("value", "message"), [
    (torch.tensor([0.5, 0.5, 0.5]), r"must be one number per layer or one per KV head \(2"),
    (torch.ones(2, 2), r"must be one number per layer or one per KV head"),
    (torch.tensor(0.0), "must be a finite number > 0"),
    (torch.tensor([0.5, -1.0]), "holds -1.0: a KV-cache scale must be a finite number > 0"),
    (torch.tensor([[float("nan")], [1.0]]), "holds nan"),
    (torch.tensor([1.0, float("inf")]), "holds inf"),
], ids=["3-of-2-heads", "2x2", "zero", "negative-head", "nan-head", "inf-head"])
def test_bad_scales_are_refused_naming_the_tensor(qwen3_dir: Path, tmp_path: Path,
                                                  value: torch.Tensor, message: str) -> None:
    tensors = scale_tensors(1.0, 1.0)
    tensors["model.layers.1.self_attn.k_scale"] = value
    folder = with_scales(qwen3_dir, tmp_path / "ckpt", tensors)
    with pytest.raises(WeightLoadError, match=rf"model\.layers\.1\.self_attn\.k_scale.*{message}"):
        read_kv_scales(Checkpoint(folder), [f"model.layers.{n}.self_attn." for n in range(2)],
                       2)


def test_twice_the_blocks_of_a_bf16_cache_for_one_budget(qwen3_dir: Path) -> None:
    plugins = PluginManager()
    sizes = {}
    for kv in ("auto", "fp8"):
        config = EngineConfig(model=str(qwen3_dir), device="cpu", dtype="bfloat16",
                              kv_cache_dtype=kv, cpu_kv_cache_gib=400 * 4096 / (1 << 30))
        model = load_model(config, plugins).model
        per_block = model.kv_bytes_per_block(16)
        sizes[kv] = (per_block, kv_blocks(config, model, torch.device("cpu")))
    # 2 layers x K and V x 2 kv heads x 16 dims x 16 tokens: 4096 bytes in bf16.
    assert sizes == {"auto": (4096, 400), "fp8": (2048, 800)}


def test_offload_round_trip_of_e4m3_blocks(qwen3_dir: Path) -> None:
    # A 14-block device cache holds one 150-token prompt: the second round of four prompts
    # comes back from host memory, byte for byte, so the tokens are those without offload.
    batch = [[random.Random(10 + i).randrange(1, 1000) for _ in range(150)] for i in range(4)]
    fp8_block = 2 * 2 * 2 * 16 * 16  # layers x K/V x kv heads x dims x tokens, one byte each

    def second_round(e: Engine) -> tuple[list[list[int]], list[int]]:
        greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        reqs = [GenerateRequest(f"r{i}", tuple(p), greedy) for i, p in enumerate(batch * 2)]
        events = run_staggered(e, reqs, lambda i: 40 * i)
        second = [events[f"r{i}"] for i in range(4, 8)]
        cached = [next(ev.cached_tokens for ev in evs if isinstance(ev, Scheduled))
                  for evs in second]
        return [tokens_of(evs) for evs in second], cached

    base = dict(model=str(qwen3_dir), device="cpu", kv_cache_dtype="fp8", num_kv_blocks=14)
    plain = Engine(EngineConfig(**base))  # type: ignore[arg-type]
    want, cached = second_round(plain)
    plain.close()
    assert cached == [0] * 4
    e = Engine(EngineConfig(**base, kv_offload=("host",),  # type: ignore[arg-type]
                            kv_offload_host_gib=200 * fp8_block / (1 << 30)))
    assert e.model.kv_block_tensors()[0].dtype == torch.float8_e4m3fn
    tokens, cached = second_round(e)
    assert tokens == want
    assert cached == [144] * 4
    assert e.offload.stats().restored_blocks == 36  # type: ignore[union-attr]
    e.close()


def test_lines_without_an_fp8_kv_cache_refuse_it(tmp_path: Path) -> None:
    assert supports_fp8_kv_cache(Qwen3ModelLine)
    assert not supports_fp8_kv_cache(DeepseekV4ModelLine)
    # DeepSeek-V4 keeps its KV in its own layout: refused before any weight is read.
    (tmp_path / "config.json").write_text(json.dumps(DEMO_CONFIG))
    config = EngineConfig(model=str(tmp_path), device="cpu", kv_cache_dtype="fp8")
    with pytest.raises(ModelConfigError, match=r"'deepseek-v4' has no FP8 KV cache.*leave out "
                                               r"--kv-cache-dtype fp8"):
        load_model(config, PluginManager())


def test_each_tensor_parallel_rank_keeps_e4m3_pages(qwen3_dir: Path) -> None:
    # Two CPU ranks, each with the e4m3 pages of its KV head. The ranks' K/V match one rank's
    # up to the all-reduce's summation order (~1e-7 relative), which can move a value on an
    # e4m3 rounding boundary to the next step: logits agree to well under the fp8 drift (ranks
    # that kept fp32 pages would sit as far from one e4m3 rank as an fp32 engine does).
    one, fp32 = (Engine(EngineConfig(model=str(qwen3_dir), device="cpu", kv_cache_dtype=kv,
                                     num_kv_blocks=64)) for kv in ("fp8", "auto"))
    two = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", kv_cache_dtype="fp8",
                              num_kv_blocks=64, tensor_parallel_size=2))
    try:
        for ids in PROMPTS[:3]:
            ref, got = prompt_logits(one, ids), prompt_logits(two, ids)
            drift = (prompt_logits(fp32, ids) - ref).norm()
            assert (got - ref).norm() < 0.2 * drift
            assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.95
    finally:
        for e in (one, fp32, two):
            e.close()
