"""`openinfer bench latency|throughput`: flags, and whole runs on a tiny checkpoint on CPU."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from openinfer_server.bench.dataset import random_requests
from openinfer_server.cli import build_parser, main

ENGINE_FLAGS = [
    "--load-format", "--dtype", "--device", "--max-model-len", "--max-num-seqs",
    "--max-num-batched-tokens", "--gpu-memory-utilization", "--enforce-eager", "--seed",
    "--num-kv-blocks", "--block-size", "--scheduler",
]
SMALL_ENGINE = ["--device", "cpu", "--max-num-seqs", "8", "--num-kv-blocks", "64"]


def _bench(capsys: pytest.CaptureFixture[str], argv: list[str], result: Path,
           ) -> tuple[dict[str, Any], str]:
    assert main(["bench", *argv, "--result-file", str(result)]) == 0
    out = capsys.readouterr().out
    return json.loads(result.read_text()), out


def test_bench_help_lists_the_modes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for mode in ("latency", "throughput", "prefix", "serve", "interference"):
        assert re.search(rf"^\s+{mode}\b", out, re.MULTILINE), mode


@pytest.mark.parametrize("mode", ["serve", "bench latency", "bench throughput",
                                  "bench prefix"])
def test_engine_flags_are_shared(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([*mode.split(), "--help"])
    out = capsys.readouterr().out
    for flag in ENGINE_FLAGS:
        assert flag in out, (mode, flag)
    assert "MODEL" in out and "demo" in out


def test_bench_engine_defaults_are_the_engines() -> None:
    from openinfer_core.engine.config import EngineConfig

    defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    for mode in ("latency", "throughput", "prefix"):
        args = build_parser().parse_args(["bench", mode])
        for name in ("device", "dtype", "max_model_len", "max_num_seqs", "block_size",
                     "max_num_batched_tokens", "num_kv_blocks", "gpu_memory_utilization",
                     "scheduler", "seed", "enforce_eager", "load_format"):
            assert getattr(args, name) == defaults[name], (mode, name)
    latency = build_parser().parse_args(["bench", "latency"])
    assert (latency.input_len, latency.output_len, latency.num_iters,
            latency.num_iters_warmup) == ([128], 128, 10, 2)
    assert build_parser().parse_args(["bench", "latency", "--input-len", "128", "2048"]
                                     ).input_len == [128, 2048]
    prefix = build_parser().parse_args(["bench", "prefix"])
    assert (prefix.input_len, prefix.output_len, prefix.num_iters,
            prefix.num_iters_warmup) == ([256, 1024, 4096, 16384], 1, 10, 1)
    assert prefix.enable_prefix_caching


@pytest.mark.parametrize("argv, message", [
    (["bench"], "required: MODE"),
    (["bench", "latency", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["bench", "latency", "--port", "8000"], "unrecognized arguments: --port"),
    (["bench", "latency", "--input-len", "0"], "--input-len: must be >= 1, got 0"),
    (["bench", "latency", "--num-iters-warmup", "-1"], "--num-iters-warmup: must be >= 0"),
    (["bench", "throughput", "--random-range-ratio", "1"],
     "--random-range-ratio: must be in [0, 1), got 1.0"),
    (["bench", "serve", "--request-rate", "0"], "--request-rate: must be > 0 (or inf), got 0.0"),
    (["bench", "serve", "--request-rate", "fast"], "--request-rate: must be requests per"),
    (["bench", "serve", "--max-concurrency", "0"], "--max-concurrency: must be >= 1, got 0"),
    (["bench", "serve", "--metric-percentiles", "50,101"], "--metric-percentiles: each must"),
    (["bench", "serve", "--result-file", "a.json", "--result-dir", "d"],
     "not allowed with argument --result-file"),
    (["bench", "serve", "--device", "cpu"], "unrecognized arguments: --device"),
    (["bench", "prefix", "--num-iters", "0"], "--num-iters: must be >= 1, got 0"),
    (["bench", "interference", "--device", "cpu"], "unrecognized arguments: --device"),
    (["bench", "interference", "--duration", "0"], "--duration: must be > 0 and finite"),
    (["bench", "interference", "--long-arrival", "burst"], "--long-arrival: invalid choice"),
    (["bench", "interference", "--duration", "5", "--long-interval", "5"],
     "--long-interval 5 sends no long prompt within --duration 5"),
    (["bench", "serve", "--request-rate", "1", "2", "--num-prompts", "1", "2", "3"],
     "--num-prompts: give one count, or one per --request-rate value (2), not 3"),
])
def test_bad_bench_arguments_exit_2(argv: list[str], message: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    # argparse reports unknown flags with the top-level usage, the rest with the mode's.
    assert err.startswith("usage: openinfer" if "unrecognized" in message
                          else "usage: openinfer bench")
    assert message in err


def test_engine_refusals_exit_2_with_the_modes_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "latency", "--device", "cpu", "--scheduler", "lifo"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: openinfer bench latency")
    assert "--scheduler: unknown scheduler 'lifo'" in err


def test_latency(checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result, out = _bench(capsys, [
        "latency", str(checkpoint), *SMALL_ENGINE, "--input-len", "8", "24", "--output-len", "4",
        "--num-iters", "3", "--num-iters-warmup", "1"], tmp_path / "latency.json")
    assert result["mode"] == "latency" and result["model_id"] == str(checkpoint)
    assert result["command"][:3] == ["openinfer", "bench", "latency"]
    assert result["gpu"] is None and result["ceiling"]["device"] == "cpu"
    assert result["ceiling"]["read_gbps"] > 0 and result["ceiling"]["matmul_tflops"] > 0
    assert "commit" in result
    assert [(r["input_len"], r["output_len"], r["num_iters"]) for r in result["runs"]] == [
        (8, 4, 3), (24, 4, 3)]
    for run in result["runs"]:
        assert len(run["ttfts"]) == len(run["e2els"]) == 3
        for name in ("ttft", "tpot", "e2el"):
            assert 0 < run[f"median_{name}_ms"] <= run[f"p99_{name}_ms"], name
            assert run[f"mean_{name}_ms"] > 0
        assert all(0 < t < e for t, e in zip(run["ttfts"], run["e2els"], strict=True))
        # TPOT is (E2E - TTFT) / (tokens - 1), per request, averaged.
        tpots = [(e - t) / 3 * 1000 for t, e in zip(run["ttfts"], run["e2els"], strict=True)]
        assert run["mean_tpot_ms"] == pytest.approx(sum(tpots) / 3)
    weight_bytes = result["weight_bytes"]
    if weight_bytes is None:  # the model line does not say: no floor, no ratio
        assert result["decode_floor_ms"] is None
        assert result["runs"][0]["tpot_over_floor"] is None
    else:
        floor_ms = weight_bytes / (result["ceiling"]["read_gbps"] * 1e9) * 1e3
        assert result["decode_floor_ms"] == pytest.approx(floor_ms)
        run = result["runs"][0]
        assert run["tpot_over_floor"] == pytest.approx(run["median_tpot_ms"] / floor_ms)
    assert "Latency Benchmark Result" in out and "Median TPOT / decode floor:" in out
    assert re.search(r"Read bandwidth on cpu \(GB/s\):\s+\d", out)


def test_latency_of_a_batch(checkpoint: Path, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    """--batch-size N (vLLM's flag): N requests added together, each one's TTFT and TPOT; the
    batch runs together, so every request's first token comes before any request's last."""
    result, out = _bench(capsys, [
        "latency", str(checkpoint), *SMALL_ENGINE, "--input-len", "8", "--output-len", "5",
        "--batch-size", "4", "--num-iters", "2", "--num-iters-warmup", "1"],
        tmp_path / "latency.json")
    run = result["runs"][0]
    assert (run["batch_size"], run["num_iters"]) == (4, 2)
    assert len(run["ttfts"]) == len(run["e2els"]) == 8
    assert "batch 4" in out
    for i in (0, 4):  # each measured batch
        ttfts, e2els = run["ttfts"][i:i + 4], run["e2els"][i:i + 4]
        assert max(ttfts) < min(e2els)


def test_a_batch_larger_than_max_num_seqs_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "latency", *SMALL_ENGINE, "--batch-size", "9"])
    assert exit_info.value.code == 2
    assert "--batch-size 9 is more than --max-num-seqs 8" in capsys.readouterr().err


@pytest.mark.parametrize("caching", [True, False])
def test_prefix(caching: bool, checkpoint: Path, tmp_path: Path,
                capsys: pytest.CaptureFixture[str]) -> None:
    flags = [] if caching else ["--no-prefix-cache"]
    result, out = _bench(capsys, [
        "prefix", str(checkpoint), *SMALL_ENGINE, *flags, "--input-len", "8", "40", "100",
        "--num-iters", "3", "--num-iters-warmup", "1"], tmp_path / "prefix.json")
    assert result["mode"] == "prefix" and result["command"][:3] == ["openinfer", "bench",
                                                                   "prefix"]
    assert result["ceiling"]["device"] == "cpu" and "commit" in result
    assert (result["block_size"], result["enable_prefix_caching"]) == (16, caching)
    assert [(r["input_len"], r["output_len"], r["num_iters"]) for r in result["runs"]] == [
        (8, 1, 3), (40, 1, 3), (100, 1, 3)]
    # Warm: every full block of the prompt, short of the one token always computed; the
    # shorter-than-a-block prompt and a cache that is off reuse nothing.
    expected = {8: 0, 40: 32, 100: 96} if caching else {8: 0, 40: 0, 100: 0}
    for run in result["runs"]:
        n = run["input_len"]
        assert run["warm_cached_tokens"] == [expected[n]] * 3
        assert run["min_warm_cached_tokens"] == expected[n] >= (n - 16 if caching else 0)
        assert run["cached_fraction"] == pytest.approx(expected[n] / n)
        assert len(run["cold_ttfts"]) == len(run["warm_ttfts"]) == 3
        for kind in ("cold", "warm"):
            assert 0 < run[f"median_{kind}_ttft_ms"] <= run[f"p99_{kind}_ttft_ms"]
        assert run["warm_speedup"] == pytest.approx(
            run["median_cold_ttft_ms"] / run["median_warm_ttft_ms"])
    assert "Prefix Cache Benchmark Result" in out
    assert ("Warm prompt tokens from the cache:       96.0% (least 96)" in out) == caching


def test_prefix_refuses_a_warm_request_that_missed(checkpoint: Path, monkeypatch:
                                                   pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from openinfer_server.bench import prefix

    monkeypatch.setattr(prefix, "least_warm_hit", lambda n, block, caching: n)
    assert main(["bench", "prefix", str(checkpoint), *SMALL_ENGINE, "--input-len", "40",
                 "--num-iters", "1", "--num-iters-warmup", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("error: the warm request of prompt 0 (40 tokens) reused only 32 cached "
                   "tokens, not the 40 expected; was its KV evicted? (raise --num-kv-blocks "
                   "or --gpu-memory-utilization)")


def test_throughput(checkpoint: Path, tmp_path: Path,
                    capsys: pytest.CaptureFixture[str]) -> None:
    result, out = _bench(capsys, [
        "throughput", str(checkpoint), *SMALL_ENGINE, "--num-prompts", "10", "--input-len",
        "12", "--output-len", "6", "--random-range-ratio", "0.5", "--seed", "5"],
        tmp_path / "throughput.json")
    # The same seeded dataset, so the totals are known exactly.
    expected = random_requests(10, 12, 6, vocab_size=151936, range_ratio=0.5, seed=5)
    inputs = sum(r.prompt_len for r in expected)
    outputs = sum(r.output_len for r in expected)
    assert len({r.output_len for r in expected}) > 1  # the lengths really vary
    assert result["num_requests"] == 10
    assert (result["total_input_tokens"], result["total_output_tokens"]) == (inputs, outputs)
    assert result["total_num_tokens"] == inputs + outputs
    elapsed = result["elapsed_time"]
    assert elapsed > 0
    assert result["requests_per_second"] == pytest.approx(10 / elapsed)
    assert result["output_tokens_per_second"] == pytest.approx(outputs / elapsed)
    assert result["tokens_per_second"] == pytest.approx((inputs + outputs) / elapsed)
    assert result["ceiling"]["device"] == "cpu"
    assert "Throughput Benchmark Result" in out and "Output token throughput" in out


def test_lengths_past_the_model_are_refused(checkpoint: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "latency", str(checkpoint), *SMALL_ENGINE, "--max-model-len", "64",
                 "--input-len", "60", "--output-len", "8"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("error: a request of 60 prompt + 8 output tokens exceeds the model's length "
                   "of 64 tokens; lower the lengths or raise --max-model-len")


def test_result_dir_gets_a_generated_name(checkpoint: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "throughput", str(checkpoint), *SMALL_ENGINE, "--num-prompts", "2",
                 "--input-len", "4", "--output-len", "2", "--result-dir",
                 str(tmp_path / "out")]) == 0
    [written] = (tmp_path / "out").iterdir()
    assert re.fullmatch(r"openinfer-throughput-.+-n2-in4-out2-\d{8}-\d{6}\.json", written.name)
    assert json.loads(written.read_text())["total_output_tokens"] == 4
    assert f"results written to {written}" in capsys.readouterr().out
