"""Qwen3's FP8 linears kept FP8 (OPENINFER_FP8_WEIGHTS=keep): each is an `Fp8BlockWeight`
where its blocks allow (fusions whose leading parts are whole 128-row blocks, tensor-parallel
parts that start on a block), the others dequantized; a kept weight dequantizes to exactly the
tensor the default path loads, the weight-read floor counts e4m3 bytes and scales, and the
engine decodes the dequantized model's greedy tokens.

`keep` runs on CUDA only; here the tests let it run on the CPU (`KEEP_DEVICES`) with the
Triton kernels of `fp8_dynamic_linear` in the forward (under the interpreter; compiled where a
GPU is), so the kernels that a GPU runs are the ones checked: the weight-only linear for
decode-size products (gate_up's with silu * mul fused in, o_proj's and down's with the add +
norm after them: the same numbers as the unfused ops), and activations quantized to e4m3
(W8A8) for prompt-size ones, whose prompt logprobs stay within a measured bound of the
dequantized model's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fp8_checkpoints import GREEDY, PROMPTS, SPECS, write_pair

import openinfer_kernels.fp8_linear.dynamic as dynamic
import openinfer_qwen3.fp8_weights as fp8_weights
import openinfer_qwen3.linears as linears
from openinfer_core import Engine, EngineConfig, GenerateRequest, SamplingParams
from openinfer_core.events import PromptLogprobs, Token
from openinfer_core.testing import run_staggered, tokens_of
from openinfer_core.weights.checkpoint import Checkpoint
from openinfer_core.weights.fp8_checkpoint import Fp8BlockWeight
from openinfer_kernels.activation.triton import silu_and_mul_triton
from openinfer_kernels.fp8_linear import (
    dequant_fp8_blocks_ref,
    fp8_block_linear_add_rms_norm,
    fp8_block_linear_silu_mul,
    fp8_dynamic_linear,
)
from openinfer_kernels.fp8_linear.quant_fused import (
    add_rms_norm_group_quant_triton,
    rms_norm_group_quant_triton,
    silu_mul_group_quant_triton,
)
from openinfer_kernels.fp8_linear.triton import (
    fp8_block_linear_add_rms_norm_triton,
    fp8_block_linear_silu_mul_triton,
    fp8_block_linear_triton,
)
from openinfer_kernels.fp8_linear.w8a8_triton import (
    fp8_group_quant_triton,
    fp8_w8a8_linear_triton,
)
from openinfer_kernels.norm.triton import fused_add_rms_norm_triton, rms_norm_triton
from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.model import Qwen3Model
from openinfer_qwen3.weights import Qwen3Shard, Qwen3Weights, load_weights

LINEARS = ("qkv", "o_proj", "gate_up", "down")
# Which linears stay FP8, per model and rank (see SPECS): q (192 rows) and gate (320) are not
# whole blocks, so their fusions are dequantized; a second rank's o/down columns start inside
# a block in "partial-blocks"; in "whole-blocks" a rank's k (64 rows) is not whole blocks
# and the second rank's k/v start inside one.
KEPT = {
    ("partial-blocks", None): {"o_proj", "down"},
    ("partial-blocks", (0, 2)): {"o_proj", "down"},
    ("partial-blocks", (1, 2)): set(),
    ("whole-blocks", None): {"qkv", "o_proj", "gate_up", "down"},
    ("whole-blocks", (0, 2)): {"o_proj", "gate_up", "down"},
    ("whole-blocks", (1, 2)): {"o_proj", "gate_up", "down"},
}
# (M, N, K, path) of each FP8 product in the forward; path "weight-only", "w8a8", or the
# weight-only product's fusions "silu-mul" (gate_up) and "add-norm" (o_proj, down).
CALLS: list[tuple[int, int, int, str]] = []
ON_GPU = torch.cuda.is_available()


def _gpu(t: torch.Tensor) -> torch.Tensor:
    return t.cuda() if ON_GPU else t


def counted_block(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The weight-only Triton kernel: under the interpreter, or compiled where a GPU is."""
    CALLS.append((x.shape[0], *w.shape, "weight-only"))
    return fp8_block_linear_triton(_gpu(x), _gpu(w), _gpu(scale), out_dtype).to(x.device)


def counted_w8a8(xq: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor,
                 scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    CALLS.append((xq.shape[0], *w.shape, "w8a8"))
    # (activations quantized by a fused reference arrive on the CPU)
    return fp8_w8a8_linear_triton(_gpu(xq), _gpu(x_scale), _gpu(w), _gpu(scale),
                                  out_dtype).cpu()


def quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return fp8_group_quant_triton(_gpu(x))


def counted_silu_mul(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    CALLS.append((x.shape[0], *w.shape, "silu-mul"))
    return fp8_block_linear_silu_mul_triton(_gpu(x), _gpu(w), _gpu(scale)).to(x.device)


def counted_add_norm(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                     residual: torch.Tensor, norm_weight: torch.Tensor, eps: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    CALLS.append((x.shape[0], *w.shape, "add-norm"))
    normed, summed = fp8_block_linear_add_rms_norm_triton(
        _gpu(x), _gpu(w), _gpu(scale), _gpu(residual), _gpu(norm_weight), eps)
    return normed.to(x.device), summed.to(x.device)


def unfused_silu_mul(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The weight-only product, then `silu_and_mul`: two Triton ops."""
    return silu_and_mul_triton(_gpu(counted_block(x, w, scale))).to(x.device)


def unfused_add_norm(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                     residual: torch.Tensor, norm_weight: torch.Tensor, eps: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight-only product, then `fused_add_rms_norm`: two Triton ops."""
    normed, summed = fused_add_rms_norm_triton(_gpu(counted_block(x, w, scale)),
                                               _gpu(residual), _gpu(norm_weight), eps)
    return normed.to(x.device), summed.to(x.device)


# The fused activation quantizations (`linears.takes_quantized`) that ran, by name, in the
# test that puts these Triton forms in (elsewhere they dispatch by device: on CPU tensors,
# the references).
FUSED_QUANT: list[str] = []


def norm_quant(x: torch.Tensor, weight: torch.Tensor,
               eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    FUSED_QUANT.append("norm")
    return rms_norm_group_quant_triton(_gpu(x), _gpu(weight), eps)


def add_norm_quant(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    FUSED_QUANT.append("add-norm")
    q, scale, summed = add_rms_norm_group_quant_triton(_gpu(x), _gpu(residual), _gpu(weight),
                                                       eps)
    return q, scale, summed.to(x.device)


def silu_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    FUSED_QUANT.append("silu-mul")
    return silu_mul_group_quant_triton(_gpu(x))


@pytest.fixture
def keep(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(fp8_weights.FP8_WEIGHTS_ENV, "keep")
    monkeypatch.delenv(dynamic.FP8_LINEAR_ENV, raising=False)
    monkeypatch.setattr(fp8_weights, "KEEP_DEVICES", frozenset({"cpu", "cuda"}))
    monkeypatch.setattr(linears, "fp8_dynamic_linear",
                        dynamic.dynamic_linear(counted_block, quant, counted_w8a8))
    monkeypatch.setattr(linears, "fp8_block_linear_silu_mul", counted_silu_mul)
    monkeypatch.setattr(linears, "fp8_block_linear_add_rms_norm", counted_add_norm)
    CALLS.clear()
    FUSED_QUANT.clear()
    yield


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    return {name: write_pair(config, tmp_path_factory.mktemp(name))
            for name, config in SPECS.items()}


def _load(folder: Path, rank_of: tuple[int, int] | None, keep_fp8: bool) -> Qwen3Weights:
    cfg = Qwen3Config.from_dict(json.loads((folder / "config.json").read_text()))
    shard = None if rank_of is None else Qwen3Shard.of(cfg, *rank_of)
    return load_weights(Checkpoint(folder), cfg, dtype=torch.float32,
                        device=torch.device("cpu"), shard=shard, keep_fp8=keep_fp8)


@pytest.mark.parametrize(("spec", "rank_of"), sorted(KEPT, key=str), ids=str)
def test_kept_linears_dequantize_to_the_loaded_ones(pairs: dict[str, tuple[Path, Path]],
                                                    spec: str,
                                                    rank_of: tuple[int, int] | None) -> None:
    fp8_dir = pairs[spec][0]
    kept, plain = _load(fp8_dir, rank_of, True), _load(fp8_dir, rank_of, False)
    saved = 0
    for n, (k_layer, p_layer) in enumerate(zip(kept.layers, plain.layers, strict=True)):
        for field in LINEARS:
            got, want = getattr(k_layer, field), getattr(p_layer, field)
            assert isinstance(want, torch.Tensor)
            if field not in KEPT[spec, rank_of]:
                assert isinstance(got, torch.Tensor) and torch.equal(got, want), (n, field)
                continue
            assert isinstance(got, Fp8BlockWeight), (n, field)
            assert got.weight.dtype == torch.float8_e4m3fn and got.scale.dtype == torch.float32
            assert got.weight.is_contiguous() and got.skip == 0
            assert torch.equal(dequant_fp8_blocks_ref(got.weight, got.scale,
                                                      dtype=torch.float32), want), (n, field)
            saved += want.numel() * 3 - got.scale.numel() * 4  # fp32 -> e4m3 + scales
    assert plain.decode_bytes() - kept.decode_bytes() == saved


def test_default_keeps_on_cuda_and_cpu_dequantizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fp8_weights.FP8_WEIGHTS_ENV, raising=False)
    assert fp8_weights.keep_fp8_weights(torch.device("cuda"))
    assert not fp8_weights.keep_fp8_weights(torch.device("cpu"))
    monkeypatch.setenv(fp8_weights.FP8_WEIGHTS_ENV, "dequantize")
    assert not fp8_weights.keep_fp8_weights(torch.device("cuda"))
    monkeypatch.setenv(fp8_weights.FP8_WEIGHTS_ENV, "keep")
    assert fp8_weights.keep_fp8_weights(torch.device("cuda"))
    assert not fp8_weights.keep_fp8_weights(torch.device("cpu"))
    monkeypatch.setenv(fp8_weights.FP8_WEIGHTS_ENV, "fp8")
    with pytest.raises(ValueError, match="OPENINFER_FP8_WEIGHTS must be one of dequantize, "
                                         "keep, not 'fp8'"):
        fp8_weights.keep_fp8_weights(torch.device("cuda"))


def _greedy(engine: Engine, count: int) -> list[list[int]]:
    requests = [GenerateRequest(f"p{i}", tuple(p), GREEDY) for i, p in enumerate(PROMPTS[:count])]
    events = run_staggered(engine, requests, arrival_step=lambda i: i)
    return [tokens_of(events[f"p{i}"]) for i in range(count)]


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_kept_model_decodes_the_dequantized_tokens(pairs: dict[str, tuple[Path, Path]],
                                                   spec: str, keep: None) -> None:
    """Four staggered prompts (prefill chunks and decode rows mixed): the FP8 kernel's
    products give the greedy tokens of the model dequantized at load."""
    fp8_dir, plain_dir = pairs[spec]
    with pytest.MonkeyPatch.context() as m:
        m.setenv(fp8_weights.FP8_WEIGHTS_ENV, "dequantize")
        want = _greedy(Engine(EngineConfig(model=str(plain_dir), device="cpu")), 4)
    assert not CALLS
    engine = Engine(EngineConfig(model=str(fp8_dir), device="cpu"))
    model = engine.model
    assert isinstance(model, Qwen3Model)
    assert {f for f in LINEARS if isinstance(getattr(model.w.layers[0], f), Fp8BlockWeight)
            } == KEPT[spec, None]
    assert _greedy(engine, 4) == want
    rows = {m for m, _, _, _ in CALLS}
    assert 1 in rows and max(rows) > 1  # the one-row path and the tl.dot path ran
    # No product reached W8A8_MIN_ROWS: every one the weight-only kernel's, as before W8A8,
    # each fused product's in its fused form (the last layer's down has no add + norm after
    # it: a plain product).
    assert max(rows) < dynamic.W8A8_MIN_ROWS
    assert {c[3] for c in CALLS} == FUSED_PATHS[spec]


# The paths a decode-size product takes, by which linears stay FP8 (KEPT).
FUSED_PATHS = {"partial-blocks": {"weight-only", "add-norm"},
               "whole-blocks": {"weight-only", "add-norm", "silu-mul"}}


def _greedy_logprobs(engine: Engine) -> tuple[list[list[int]], torch.Tensor]:
    """Two staggered prompts' greedy tokens and their logprobs: steps of 3, 9, 2 and 1 rows."""
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=0)
    requests = [GenerateRequest(f"p{i}", tuple(p), params) for i, p in enumerate(PROMPTS[:2])]
    events = run_staggered(engine, requests, arrival_step=lambda i: i)
    tokens = [[e for e in events[f"p{i}"] if isinstance(e, Token)] for i in range(2)]
    return ([[t.token_id for t in row] for row in tokens],
            torch.tensor([t.logprob for row in tokens for t in row], dtype=torch.float64))


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_fused_products_decode_as_the_unfused_ones(pairs: dict[str, tuple[Path, Path]],
                                                   spec: str, keep: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused decode products (silu * mul in gate_up's kernel or split sum, o_proj's and
    down's split shares summed by the add + norm kernel) against the weight-only product
    followed by the unfused ops: the same tokens, logprobs equal to fp32's summation-order
    noise. Staggered prompts give one-row steps (K unsplit) and steps of a few rows (split)."""
    fp8_dir = pairs[spec][0]
    fused = _greedy_logprobs(Engine(EngineConfig(model=str(fp8_dir), device="cpu")))
    assert {c[3] for c in CALLS} == FUSED_PATHS[spec]
    assert {m for m, _, _, path in CALLS if path == "add-norm"} == {1, 2, 3, 9}
    CALLS.clear()
    monkeypatch.setattr(linears, "fp8_block_linear_silu_mul", unfused_silu_mul)
    monkeypatch.setattr(linears, "fp8_block_linear_add_rms_norm", unfused_add_norm)
    unfused = _greedy_logprobs(Engine(EngineConfig(model=str(fp8_dir), device="cpu")))
    assert {c[3] for c in CALLS} == {"weight-only"}
    assert fused[0] == unfused[0]
    torch.testing.assert_close(fused[1], unfused[1], rtol=0, atol=2e-2 if ON_GPU else 1e-4)


PROMPT = [(29 * j + 5) % 384 for j in range(40)]
# The prompt's logprobs with W8A8 prefill against the dequantized model's, as a fraction of
# their mean magnitude (~11 nats in these random models). Each linear's input rounded to e4m3
# (at most 2^-4 relative; 0.5-2.6% rms error in a linear's output in test_fp8_w8a8) moved
# them by up to 11% (mean 3.0%) in "whole-blocks", every linear FP8, and 4.7% (1.6%) in
# "partial-blocks", whose qkv and gate_up stay dequantized, measured under the interpreter;
# the bounds are about twice that.
W8A8_DRIFT = {"max": 0.25, "mean": 0.06}
W8A8_SPREAD_GPU = 0.06


def _prompt_logprobs(engine: Engine) -> torch.Tensor:
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=0)
    events = run_staggered(engine, [GenerateRequest("p", tuple(PROMPT), params)],
                           arrival_step=lambda i: 0)
    found = [e for e in events["p"] if isinstance(e, PromptLogprobs)]
    assert len(found) == 1
    return torch.tensor(found[0].logprobs)


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_w8a8_prefill_stays_near_the_dequantized_model(
        pairs: dict[str, tuple[Path, Path]], spec: str, keep: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 40-token prompt with W8A8_MIN_ROWS at 16: its prefill products take the W8A8 path,
    its decode step the weight-only one. Its prompt logprobs are those of the same model
    over the references (`fp8_dynamic_linear` on CPU tensors), and stay within the bound of
    activation rounding of the dequantized model's (and move: the activations were
    quantized)."""
    fp8_dir, plain_dir = pairs[spec]
    with pytest.MonkeyPatch.context() as m:
        m.setenv(fp8_weights.FP8_WEIGHTS_ENV, "dequantize")
        want = _prompt_logprobs(Engine(EngineConfig(model=str(plain_dir), device="cpu")))
    monkeypatch.setattr(dynamic, "W8A8_MIN_ROWS", 16)
    got = _prompt_logprobs(Engine(EngineConfig(model=str(fp8_dir), device="cpu")))
    decode = {(1, path) for path in FUSED_PATHS[spec]}
    assert {(m, path) for m, _, _, path in CALLS} == {(len(PROMPT), "w8a8"), *decode}
    monkeypatch.setattr(linears, "fp8_dynamic_linear", fp8_dynamic_linear)
    monkeypatch.setattr(linears, "fp8_block_linear_silu_mul", fp8_block_linear_silu_mul)
    monkeypatch.setattr(linears, "fp8_block_linear_add_rms_norm", fp8_block_linear_add_rms_norm)
    reference = _prompt_logprobs(Engine(EngineConfig(model=str(fp8_dir), device="cpu")))
    scale = want.abs().mean()
    if ON_GPU:
        # Compiled, the FP8 MMA sums ~14 bits a step and each layer's output, a few ulps off
        # the reference's, can round its next activation to a neighbouring e4m3 value; that
        # flip compounds over the layers (0.34 nats at worst, 3.1% of the logprobs' mean
        # magnitude, on an H200 in gpu_check.sh's fp8 stage): about twice that.
        assert (got - reference).abs().max() / scale <= W8A8_SPREAD_GPU
    else:
        # The interpreter: the same roundings, the sums in another order. A sum a few fp32
        # ulps off can still round an activation to the neighbouring e4m3 value (one of 39
        # positions moved 0.0022 on a 2-core x86 machine, none on another), so all but a few
        # positions agree to 1e-3 and every one within the GPU's bound.
        off = (got - reference).abs()
        assert (off <= 1e-3).float().mean() >= 0.9, off
        assert off.max() / scale <= W8A8_SPREAD_GPU
    drift = (got - want).abs() / scale
    assert drift.max() <= W8A8_DRIFT["max"] and drift.mean() <= W8A8_DRIFT["mean"]
    assert drift.max() > 1e-3


# Which fused quantizations a W8A8 prefill runs: each where the product after it runs W8A8
# on whole 128-column groups (qkv after the first norm and each add + norm before it, gate_up
# after o_proj's add + norm, down after gate_up's silu * mul). "partial-blocks" has none: its
# hidden (192) and MLP (320) widths are not whole groups, so its FP8 products quantize their
# inputs themselves.
FUSED_QUANTS: dict[str, set[str]] = {"partial-blocks": set(),
                                     "whole-blocks": {"norm", "add-norm", "silu-mul"}}


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_fused_quantization_prefills_as_the_unfused(pairs: dict[str, tuple[Path, Path]],
                                                    spec: str, keep: None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """W8A8 prefill (W8A8_MIN_ROWS at 16) with each product's input quantized by the kernel
    that makes it (the Triton kernels of quant_fused.py), against the same model with the
    quantization in the product (OPENINFER_FP8_FUSED_QUANT=0): the same bits, so the same
    prompt logprobs exactly. The unfused norms and silu * mul run their Triton kernels too (on
    CPU tensors they would run the references, whose fp32 sums go in another order)."""
    fp8_dir = pairs[spec][0]
    monkeypatch.setattr(dynamic, "W8A8_MIN_ROWS", 16)
    monkeypatch.setattr(linears, "rms_norm_group_quant", norm_quant)
    monkeypatch.setattr(linears, "add_rms_norm_group_quant", add_norm_quant)
    monkeypatch.setattr(linears, "silu_mul_group_quant", silu_quant)
    monkeypatch.setattr(linears, "rms_norm", lambda x, w, eps: rms_norm_triton(
        _gpu(x), _gpu(w), eps).to(x.device))
    monkeypatch.setattr(linears, "silu_and_mul", lambda x: silu_and_mul_triton(
        _gpu(x)).to(x.device))
    monkeypatch.setattr(linears, "fused_add_rms_norm", lambda x, r, w, eps: tuple(
        t.to(x.device) for t in fused_add_rms_norm_triton(_gpu(x), _gpu(r), _gpu(w), eps)))
    fused = _prompt_logprobs(Engine(EngineConfig(model=str(fp8_dir), device="cpu")))
    assert set(FUSED_QUANT) == FUSED_QUANTS[spec]
    FUSED_QUANT.clear()
    monkeypatch.setenv(linears.FUSED_QUANT_ENV, "0")
    unfused = _prompt_logprobs(Engine(EngineConfig(model=str(fp8_dir), device="cpu")))
    assert not FUSED_QUANT
    assert torch.equal(fused, unfused)
