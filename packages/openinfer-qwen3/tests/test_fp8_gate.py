"""The FP8 numerics gate on the CPU, through the torch references.

1. A tiny FP8 checkpoint kept FP8 (`Fp8BlockWeight`, `fp8_dynamic_linear`'s references)
   against its dequantized copy in fp32: the same weights, so only the products' summation
   order may differ (fp32, relative ~1e-6 per product; the reference dequantizes to fp32 and
   multiplies as the plain model does, so it measured 0): greedy tokens identical and prompt
   logprobs within 1e-3 nat. With W8A8 products (activations rounded to e4m3 per 128-column
   group) the prompt logprobs move (measured: mean 0.40 nat, p99 1.37, top-1 agreement 0.87
   over 264 positions), within the activation-rounding bound of test_fp8_kept (6% of the
   ~11 nat mean |logprob|).
2. A bf16 checkpoint quantized at load (`--quantization fp8`) against the bf16 model (its
   drift, which the gate reports, not the kernels' error): mean / p99 |Δ logprob| and top-1
   agreement printed, and bounded. Each weight is rounded to e4m3 (half a step: at most 2^-4
   relative; ~2.5% rms over a block's spread of mantissas), so each linear's output moves by
   about that much rms, as W8A8's activation rounding does, and the drift is of the W8A8
   figures' size: these 2-layer models (weights 0.25 x N(0, 1), prompt logprobs ~11 nat on
   average, so a 3% move is ~0.35 nat) measured mean |Δ| 0.39 nat, p99 1.35, top-1
   agreement 0.85 over 264 positions. The bounds are about twice the drift (agreement: the
   disagreement doubled)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fp8_checkpoints import GREEDY, PROMPTS, SPECS, write_pair
from fp8_online_checkpoints import write_bf16_and_fp8

import openinfer_kernels.fp8_linear.dynamic as dynamic
import openinfer_qwen3.fp8_weights as fp8_weights
from openinfer_core import Engine, EngineConfig, GenerateRequest
from openinfer_core.testing import logprob_drift, prompt_logprobs, run_staggered, tokens_of
from openinfer_core.weights.fp8_checkpoint import Fp8BlockWeight
from openinfer_qwen3.model import Qwen3Model

LONG = [[(29 * j + 7 * i + 5) % 384 for j in range(20 + 4 * i)] for i in range(8)]
ONLINE_BOUNDS = {"dlogprob_mean": 0.8, "dlogprob_p99": 2.7, "top1_agreement": 0.7}


@pytest.fixture
def keep_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fp8_weights.FP8_WEIGHTS_ENV, "keep")
    monkeypatch.delenv(dynamic.FP8_LINEAR_ENV, raising=False)
    monkeypatch.setattr(fp8_weights, "KEEP_DEVICES", frozenset({"cpu", "cuda"}))


def _greedy(engine: Engine) -> list[list[int]]:
    requests = [GenerateRequest(f"p{i}", tuple(p), GREEDY) for i, p in enumerate(PROMPTS)]
    events = run_staggered(engine, requests, arrival_step=lambda i: i)
    return [tokens_of(events[f"p{i}"]) for i in range(len(PROMPTS))]


def test_kept_fp8_checkpoint_decodes_to_its_dequantized_copy(
        tmp_path: Path, keep_on_cpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
    fp8_dir, plain_dir = write_pair(SPECS["whole-blocks"], tmp_path)
    kept = Engine(EngineConfig(model=str(fp8_dir), device="cpu"))
    assert isinstance(kept.model, Qwen3Model)
    assert isinstance(kept.model.w.layers[0].qkv, Fp8BlockWeight)
    plain = Engine(EngineConfig(model=str(plain_dir), device="cpu"))
    assert _greedy(kept) == _greedy(plain)
    want = prompt_logprobs(plain, LONG)
    monkeypatch.setenv(dynamic.FP8_LINEAR_ENV, "weight-only")  # every product, prompts too
    weight_only = logprob_drift(want, prompt_logprobs(kept, LONG))
    print("kept FP8 (weight-only products) vs dequantized:", weight_only)
    assert weight_only["dlogprob_max"] <= 1e-3 and weight_only["top1_agreement"] == 1.0
    monkeypatch.setenv(dynamic.FP8_LINEAR_ENV, "w8a8")
    w8a8 = logprob_drift(want, prompt_logprobs(kept, LONG))
    print("kept FP8 (W8A8 prefill) vs dequantized:", w8a8)
    # Activations rounded to e4m3 (<= 2^-4 relative each): test_fp8_kept's measured bound.
    assert 1e-3 < w8a8["dlogprob_mean"] <= 0.06 * 11


def test_online_fp8_drift_from_bf16(tmp_path: Path) -> None:
    bf16_dir, _ = write_bf16_and_fp8(tmp_path)
    bf16 = prompt_logprobs(Engine(EngineConfig(model=str(bf16_dir), device="cpu")), LONG)
    fp8 = prompt_logprobs(Engine(EngineConfig(model=str(bf16_dir), device="cpu",
                                              quantization="fp8")), LONG)
    drift = logprob_drift(bf16, fp8)
    print("online FP8 vs bf16:", drift)
    assert drift["dlogprob_mean"] > 1e-3  # the weights were quantized
    assert drift["dlogprob_mean"] <= ONLINE_BOUNDS["dlogprob_mean"], drift
    assert drift["dlogprob_p99"] <= ONLINE_BOUNDS["dlogprob_p99"], drift
    assert drift["top1_agreement"] >= ONLINE_BOUNDS["top1_agreement"], drift
    assert torch.tensor(drift["positions"]) == sum(len(p) - 1 for p in LONG)
