"""The line against DeepSeek's official `inference/model.py`, through numbers it computed on CPU
in fp32 (official/make_reference_data.py writes them; official/data holds them): for each tiny
checkpoint, the whole-sequence reference and the engine give the official logits at every
prompt position and its greedy continuations. Both with the official code's FP8/FP4 rounding
inside the forward (`official_sim_on`, the line's `quant_sim`) and without (`official_sim_off`).

Tolerance: max |ours - official| over a prompt's logits, relative to their largest magnitude.
- Without the rounding, measured at most 9e-7, the reference and the engine alike (fp32
  against fp32: summation order only). 2e-5 leaves 20x for other CPUs' summation orders.
- With it, 4 of the 5 prompts measure under 2e-6; the 60-token prompt of `kinds` measures
  2.6e-5 from its 18th position on: a value within fp32 noise of a rounding midpoint lands on
  the other side there, one FP8 or FP4 step apart, and later positions carry it. 1e-3 allows
  such flips (an FP4 step is coarse) and stays far under what the rounding itself moves
  (`test_the_rounding_moves_the_logits_past_the_tolerance`), so a missing or misplaced rounding
  fails. `pytest -s` prints every prompt's error."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from openinfer_core import Engine, EngineConfig, GenerateRequest, SamplingParams
from openinfer_core.engine.batch import plan_batch
from openinfer_core.engine.request_state import RequestState
from openinfer_core.interfaces.scheduler import ScheduledRow
from openinfer_core.testing import run_staggered, tokens_of
from openinfer_deepseek_v4 import kv_cache
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.deepseek_names import weights_from_deepseek
from openinfer_deepseek_v4.quant_sim import QUANT_SIM_ENV
from openinfer_deepseek_v4.reference import forward
from openinfer_deepseek_v4.tokenizer_files import write_tokenizer_files

DATA = Path(__file__).parent / "official" / "data"
CASES = sorted(p.name for p in DATA.iterdir() if p.is_dir())
TOLERANCE = {"off": 2e-5, "on": 1e-3}


@dataclass(frozen=True, slots=True)
class Official:
    """What the official code computed for one prompt."""

    prompt: list[int]
    prefill_logits: torch.Tensor  # [T, vocab]
    greedy: list[int]  # N tokens
    decode_logits: torch.Tensor  # [N - 1, vocab]: the logits of greedy tokens 1..N-1


def official_runs(case: str, sim: str = "off") -> list[Official]:
    data = load_file(str(DATA / case / f"official_sim_{sim}.safetensors"))
    count = sum(name.startswith("prompt.") for name in data)
    return [Official(data[f"prompt.{i}"].tolist(), data[f"prefill_logits.{i}"],
                     data[f"greedy.{i}"].tolist(), data[f"decode_logits.{i}"])
            for i in range(count)]


@pytest.fixture(scope="module", params=CASES)
def case(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A case's name and its model folder: the committed checkpoint, the tokenizer files."""
    name: str = request.param
    folder = tmp_path_factory.mktemp("official") / name
    folder.mkdir()
    for file in ("config.json", "model.safetensors"):
        shutil.copyfile(DATA / name / file, folder / file)
    return name, write_tokenizer_files(folder)


def relative_error(ours: torch.Tensor, want: torch.Tensor) -> float:
    return ((ours - want).abs().max() / want.abs().max()).item()


def assert_close(ours: torch.Tensor, want: torch.Tensor, sim: str) -> None:
    error = relative_error(ours, want)
    print(f"rounding {sim}: {error:.1e}")
    assert error <= TOLERANCE[sim], f"logits differ by {error:.2e} of their largest magnitude"


@pytest.mark.parametrize("sim", ["off", "on"])
@torch.no_grad()
def test_reference_matches_the_official_code(case: tuple[str, Path], sim: str) -> None:
    """One forward over the prompt and the official continuation: its first T rows are the
    prefill's, the others the decode steps'; each row's argmax is the official next token."""
    name, folder = case
    cfg = DeepseekV4Config.from_dict(json.loads((folder / "config.json").read_text()))
    cfg = dataclasses.replace(cfg, quant_sim=sim == "on")
    weights = weights_from_deepseek(load_file(str(folder / "model.safetensors")), cfg,
                                    dtype=torch.float32)
    for run in official_runs(name, sim):
        t = len(run.prompt)
        ours = forward(torch.tensor(run.prompt + run.greedy[:-1]), weights, cfg)
        assert_close(ours[:t], run.prefill_logits, sim)
        assert_close(ours[t:], run.decode_logits, sim)
        assert ours[t - 1:].argmax(-1).tolist() == run.greedy


@torch.no_grad()
def test_the_rounding_moves_the_logits_past_the_tolerance(case: tuple[str, Path]) -> None:
    """The line without the rounding against the official numbers with it: on every prompt
    more than 10x the tolerance apart, so the test above cannot pass without the rounding."""
    name, folder = case
    cfg = DeepseekV4Config.from_dict(json.loads((folder / "config.json").read_text()))
    weights = weights_from_deepseek(load_file(str(folder / "model.safetensors")), cfg,
                                    dtype=torch.float32)
    for run in official_runs(name, "on"):
        ours = forward(torch.tensor(run.prompt), weights, cfg)
        error = relative_error(ours, run.prefill_logits)
        print(f"no rounding against the rounded official numbers: {error:.2f}")
        assert error > 10 * TOLERANCE["on"]


@torch.inference_mode()
def prefill_logits(eng: Engine, prompts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """fp32 logits at every position of each prompt, the prompts prefilled side by side in
    one step (their blocks freed afterwards)."""
    seqs = [RequestState.from_request(GenerateRequest(f"prefill{i}", tuple(p)))
            for i, p in enumerate(prompts)]
    try:
        for s in seqs:
            assert eng.kv.allocate(s.request_id, s.num_tokens)
        step = plan_batch([ScheduledRow(s, s.num_tokens, True) for s in seqs], eng.kv)
        step = step.to_device(eng.model.device)
        step.logits_indices = torch.arange(step.num_tokens)
        return list(eng.model.forward(step).split([len(p) for p in prompts]))
    finally:
        for s in seqs:
            eng.kv.free(s.request_id)


@pytest.mark.parametrize("sim", ["off", "on"])
def test_engine_matches_the_official_code(case: tuple[str, Path], sim: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill logits of the prompts side by side; greedy continuations of the prompts
    together, decoded from the paged cache (block size 8: windows and entries of both
    compressed kinds straddle blocks)."""
    name, folder = case
    monkeypatch.setenv(QUANT_SIM_ENV, sim)
    runs = official_runs(name, sim)
    eng = Engine(EngineConfig(model=str(folder), device="cpu", max_model_len=128,
                              block_size=8))
    for run, ours in zip(runs, prefill_logits(eng, [r.prompt for r in runs]), strict=True):
        assert_close(ours, run.prefill_logits, sim)
    requests = [GenerateRequest(f"greedy{i}", tuple(r.prompt),
                                SamplingParams(temperature=0.0, max_tokens=len(r.greedy),
                                               ignore_eos=True))
                for i, r in enumerate(runs)]
    events = run_staggered(eng, requests, lambda i: i)
    assert [tokens_of(events[r.request_id]) for r in requests] == [r.greedy for r in runs]
    assert eng.kv.num_used_blocks == 0


def test_stored_rounding_is_the_rounding(case: tuple[str, Path],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """With the rounding on, the full group stores the entries as FP8 and the indexer keys as
    FP4 codes (uint8 rows), and the prefill logits equal, exactly, those of the engine that
    keeps them in the model's dtype and rounds them in place; a prefix-cache hit over the
    stored blocks gives the official greedy tokens."""
    name, folder = case
    monkeypatch.setenv(QUANT_SIM_ENV, "on")
    runs = official_runs(name, "on")
    config = EngineConfig(model=str(folder), device="cpu", max_model_len=128, block_size=8)
    eng = Engine(config)
    stored = [p.entries.dtype for layer in eng.model.layers  # type: ignore[attr-defined]
              for p in (layer.compressor, layer.indexer) if p is not None]
    assert stored and set(stored) == {torch.uint8}
    ours = prefill_logits(eng, [r.prompt for r in runs])
    with monkeypatch.context() as m:
        m.setattr(kv_cache, "entry_formats", lambda cfg, dtype: (None, None))
        rounded = prefill_logits(Engine(config), [r.prompt for r in runs])
    for a, b in zip(ours, rounded, strict=True):
        assert torch.equal(a, b)
    run = max(runs, key=lambda r: len(r.prompt))
    for tag in ("warm", "hit"):
        request = GenerateRequest(tag, tuple(run.prompt),
                                  SamplingParams(temperature=0.0, max_tokens=len(run.greedy),
                                                 ignore_eos=True))
        events = run_staggered(eng, [request], lambda _: 0)[tag]
        assert tokens_of(events) == run.greedy
    cached = getattr(events[0], "cached_tokens", 0)
    assert cached >= 8 * ((len(run.prompt) - 1) // 8) - 8 > 0
