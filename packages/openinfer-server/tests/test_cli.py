"""The `openinfer` command line: parsing, `models`, error exits, and `serve` end to end."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import torch
from live_server import openinfer_command, wait_for_ready

from openinfer_server.cli import build_parser, main, package_version

VLLM_FLAGS = [
    "--host", "--port", "--served-model-name", "--max-model-len", "--max-num-seqs",
    "--max-num-batched-tokens", "--gpu-memory-utilization", "--dtype", "--device", "--api-key",
    "--enforce-eager", "--seed", "--load-format", "--block-size", "--tensor-parallel-size",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--generation-config",
    "--tool-call-parser", "--enable-auto-tool-choice", "--reasoning-parser",
    "--data-parallel-size", "--kv-cache-dtype",
]
OWN_FLAGS = ["--scheduler", "--num-kv-blocks", "--log-level", "--revision", "--download-dir",
             "--no-prefix-cache"]


def _run_cli(*args: str, env: dict[str, str] | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*openinfer_command(), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"openinfer {package_version()}"
    assert package_version() == "0.1.0"


def test_models_lists_every_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    sections = dict(re.findall(r"(?ms)^(\w[\w ]*):\n(.*?)(?=^\w|\Z)", out))
    assert set(sections) == {"model lines", "schedulers", "attention backends",
                             "offload tiers", "tool parsers", "reasoning parsers", "plugins"}
    assert re.search(r"hermes\s+plugin core", sections["tool parsers"])
    assert re.search(r"deepseek_r1\s+plugin core\n\s+qwen3\s+plugin core",
                     sections["reasoning parsers"])
    assert re.search(r"qwen3\s+Qwen3ForCausalLM\s+plugin qwen3\s+demo model",
                     sections["model lines"])
    assert re.search(r"toy-counter\s+ToyCounterForCausalLM\s+plugin toy", sections["model lines"])
    assert re.search(r"fcfs\s+plugin core", sections["schedulers"])
    assert re.search(r"torch\s+devices cpu,cuda\s+priority 0\s+plugin kernels",
                     sections["attention backends"])
    assert re.search(r"triton\s+devices cuda\s+priority 10\s+plugin kernels",
                     sections["attention backends"])
    assert re.search(r"qwen3\s+openinfer_qwen3.plugin\s+openinfer-qwen3 0.1.0",
                     sections["plugins"])


def test_serve_help_shows_the_vllm_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in VLLM_FLAGS + OWN_FLAGS:
        assert flag in out, flag
    assert "MODEL" in out and "demo" in out


def test_serve_defaults_are_the_engines() -> None:
    from openinfer_core.engine.config import EngineConfig

    args = build_parser().parse_args(["serve"])
    defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    for name in ("device", "dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                 "block_size", "num_kv_blocks", "gpu_memory_utilization", "scheduler", "seed",
                 "enable_prefix_caching", "kv_cache_dtype"):
        assert getattr(args, name) == defaults[name], name
    assert (args.host, args.port, args.model) == ("127.0.0.1", 8000, None)


@pytest.mark.parametrize(("flags", "enabled"), [
    ([], True),
    (["--enable-prefix-caching"], True),
    (["--no-enable-prefix-caching"], False),  # vLLM's spelling
    (["--no-prefix-cache"], False),
    (["--no-prefix-cache", "--enable-prefix-caching"], True),  # the last one wins
])
@pytest.mark.parametrize("command", [["serve"], ["bench", "throughput"]])
def test_prefix_cache_flags_reach_the_engine_config(command: list[str], flags: list[str],
                                                    enabled: bool) -> None:
    from openinfer_core.plugins import get_plugin_manager
    from openinfer_server.serve import engine_config

    parser = build_parser()
    args = parser.parse_args([*command, "--device", "cpu", *flags])
    config = engine_config(args, parser, get_plugin_manager().registries)
    assert config.enable_prefix_caching is enabled


def test_offload_flags_reach_the_engine_config(tmp_path: Path) -> None:
    from openinfer_core.plugins import get_plugin_manager
    from openinfer_server.serve import engine_config

    parser = build_parser()
    args = parser.parse_args(["serve", "--device", "cpu", "--kv-offload", "host,disk",
                              "--kv-offload-host-gib", "2.5", "--kv-offload-disk-dir",
                              str(tmp_path), "--kv-offload-disk-gib", "100"])
    config = engine_config(args, parser, get_plugin_manager().registries)
    assert (config.kv_offload, config.kv_offload_host_gib, config.kv_offload_disk_dir,
            config.kv_offload_disk_gib) == (("host", "disk"), 2.5, str(tmp_path), 100.0)
    assert engine_config(parser.parse_args(["serve", "--device", "cpu"]), parser,
                         get_plugin_manager().registries).kv_offload == ()


@pytest.mark.parametrize(("flag", "want"), [([], None), (["--quantization", "None"], None),
                                            (["--quantization", "fp8"], "fp8"),
                                            (["-q", "fp8"], "fp8")])
def test_quantization_reaches_the_engine_config(flag: list[str], want: str | None) -> None:
    from openinfer_core.plugins import get_plugin_manager
    from openinfer_server.serve import engine_config

    parser = build_parser()
    for mode in (["serve"], ["bench", "latency"]):
        args = parser.parse_args([*mode, "--device", "cpu", *flag])
        assert engine_config(args, parser, get_plugin_manager().registries).quantization == want


@pytest.mark.parametrize("value", ["auto", "fp8", "fp8_e4m3"])
@pytest.mark.parametrize("command", [["serve"], ["bench", "latency"]])
def test_kv_cache_dtype_reaches_the_engine_config(command: list[str], value: str) -> None:
    from openinfer_core.plugins import get_plugin_manager
    from openinfer_server.serve import engine_config

    parser = build_parser()
    args = parser.parse_args([*command, "--device", "cpu", "--kv-cache-dtype", value])
    config = engine_config(args, parser, get_plugin_manager().registries)
    assert config.kv_cache_dtype == value
    assert str(config.torch_kv_cache_dtype()) == (
        "None" if value == "auto" else "torch.float8_e4m3fn")


def test_api_key_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENINFER_API_KEY", "sk-from-env")
    assert build_parser().parse_args(["serve"]).api_key == "sk-from-env"
    assert build_parser().parse_args(["serve", "--api-key", "k"]).api_key == "k"


@pytest.mark.parametrize("argv, message", [
    ([], "required: COMMAND"),
    (["launch"], "invalid choice: 'launch'"),
    (["serve", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["serve", "--port", "http"], "--port: must be an integer, got 'http'"),
    (["serve", "--port", "70000"], "--port: must be a TCP port in 0..65535, got 70000"),
    (["serve", "--max-num-seqs", "0"], "--max-num-seqs: must be >= 1, got 0"),
    (["serve", "--max-model-len", "1"], "--max-model-len: must be >= 2, got 1"),
    (["serve", "--gpu-memory-utilization", "1.5"], "must be in (0, 1], got 1.5"),
    (["serve", "--dtype", "int3"], "--dtype: invalid choice: 'int3'"),
    (["serve", "--device", "tpu"], "--device: must be auto, cpu, cuda or cuda:N, got 'tpu'"),
    (["serve", "--load-format", "pt"], "--load-format: invalid choice: 'pt'"),
    (["serve", "--num-kv-blocks", "1"], "--num-kv-blocks: must be >= 2, got 1"),
    (["serve", "--kv-offload", "host,,disk"], "--kv-offload: must be tier names separated"),
    (["serve", "--kv-offload", "host,host"], "--kv-offload: names a tier twice"),
    (["serve", "--kv-offload-host-gib", "0"], "--kv-offload-host-gib: must be > 0, got 0.0"),
    (["serve", "--kv-offload-disk-gib", "lots"], "--kv-offload-disk-gib: must be a number"),
    (["serve", "--data-parallel-size", "0"], "--data-parallel-size/-dp: must be >= 1, got 0"),
    (["serve", "--quantization", "awq"], "--quantization/-q: 'awq' is not implemented "
                                         "(accepted: fp8, or None: the checkpoint as stored)"),
    (["bench", "latency", "-q", "int8"], "'int8' is not implemented (accepted: fp8"),
    (["serve", "--kv-cache-dtype", "fp8_e5m2"], "--kv-cache-dtype: fp8_e5m2 is not supported "
     "(the attention kernels read e4m3 pages only): use fp8 or fp8_e4m3, or auto"),
    (["serve", "--kv-cache-dtype", "int8"],
     "--kv-cache-dtype: must be one of auto, fp8, fp8_e4m3, got 'int8'"),
])
def test_bad_arguments_exit_2_with_a_message(argv: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: openinfer")
    assert message in err


@pytest.mark.parametrize("argv, message", [
    (["--scheduler", "lifo"], "--scheduler: unknown scheduler 'lifo' (installed: fcfs"),
    (["--attention-backend", "flash"],
     "--attention-backend: unknown attention backend 'flash' (installed: "),
    (["--kv-offload", "host,tape"], "--kv-offload: unknown tier 'tape' (installed: disk, host"),
    (["--kv-offload", "host,disk"], "the disk tier needs --kv-offload-disk-dir DIR"),
])
def test_values_the_engine_refuses_exit_2(argv: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--device", "cpu", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--device", "cuda"])
    assert exit_info.value.code == 2
    assert "argument --device: cuda was asked for but no GPU is visible" in capsys.readouterr().err


def test_missing_local_folder_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "/nonexistent/checkpoint", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        "error: model folder '/nonexistent/checkpoint' does not exist; pass a local "
        "HuggingFace checkpoint folder or a hub id such as Qwen/Qwen3-0.6B")


def test_folder_without_config_is_a_clear_error(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", str(tmp_path), "--device", "cpu"]) == 1
    assert "has no config.json" in capsys.readouterr().err


def test_unreachable_hub_is_a_clear_error(tmp_path: Path) -> None:
    # Port 9 (discard) refuses connections at once: the hub is unreachable, no cache exists.
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_OFFLINE": "0"}
    result = _run_cli("serve", "Qwen/Qwen3-0.6B", "--device", "cpu", env=env)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 'Qwen/Qwen3-0.6B' is not a local folder")
    assert "the hub cannot be reached and no copy is cached" in last
    assert "pass its local folder" in last


@pytest.mark.slow
def test_serve_demo_end_to_end(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    env = {**os.environ, "OPENINFER_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("OPENINFER_API_KEY", None)
    with log.open("w") as out:
        proc = subprocess.Popen([*openinfer_command(), "serve", "--port", "0", "--device", "cpu"],
                                stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url = wait_for_ready(proc, log, timeout=240)
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        # torch lives in the engine process only (the demo's weights were made in a child too)
        assert "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text()
        models = httpx.get(f"{url}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["openinfer-demo"]
        reply = httpx.post(f"{url}/v1/completions", timeout=60, json={
            "model": "openinfer-demo", "prompt": "Hello", "max_tokens": 5, "temperature": 0})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["usage"]["completion_tokens"] >= 1
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text
    assert ("serving the built-in demo model: random weights, for trying the API, "
            "not for real answers") in text
    assert re.search(r"KV cache capacity: \d+ tokens", text)
    assert re.search(r"ready in \d+\.\d\d s", text)
    for stage in range(1, 5):
        assert f"[{stage}/4]" in text
    assert text.rstrip().endswith("stopped")
    # qwen3's demo ranks first (demo_priority) though deepseek-v4 also offers one
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith("demo-")]
    assert all(p.name.startswith("demo-qwen3-") for p in (tmp_path / "cache").glob("demo-*"))


def test_demo_flag_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--demo", "no-such-line", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--demo no-such-line: no installed model line of that name offers a demo" in err
    assert "deepseek-v4" in err and "qwen3" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "some/model", "--demo", "qwen3"])
    assert exit_info.value.code == 2
    assert "give one or the other" in capsys.readouterr().err


def test_unwritable_cache_is_a_clear_error(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(blocker / "cache"))
    assert main(["serve", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: could not write the demo model (")
    assert "set OPENINFER_CACHE_DIR to a writable folder" in err


def test_tensor_parallel_size_reaches_the_engine_config() -> None:
    from openinfer_core.plugins import get_plugin_manager
    from openinfer_server.serve import engine_config

    parser = build_parser()
    args = parser.parse_args(["serve", "--device", "cpu", "-tp", "2"])
    config = engine_config(args, parser, get_plugin_manager().registries)
    assert config.tensor_parallel_size == 2


def test_data_parallel_size_reaches_the_engine_config_and_is_checked_against_the_gpus(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import openinfer_core.engine.config as config_module
    from openinfer_core.plugins import get_plugin_manager
    from openinfer_server.serve import engine_config

    parser = build_parser()
    registries = get_plugin_manager().registries
    config = engine_config(parser.parse_args(["serve", "--device", "cpu", "-dp", "2"]), parser,
                           registries)
    assert config.data_parallel_size == 2
    monkeypatch.setattr(config_module, "_cuda_device_count", lambda: 2)
    args = parser.parse_args(["serve", "--device", "cuda", "-dp", "2", "-tp", "2"])
    with pytest.raises(SystemExit) as exit_info:
        engine_config(args, parser, registries)
    assert exit_info.value.code == 2
    assert "argument --data-parallel-size: 2 replicas of 2 GPU(s) each from cuda need GPUs " \
        "0..3, but 2 GPU(s) are visible" in capsys.readouterr().err


def test_in_process_benches_refuse_data_parallelism(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "throughput", "--device", "cpu", "--data-parallel-size", "2"])
    assert exit_info.value.code == 2
    assert "--data-parallel-size: this bench drives one engine" in capsys.readouterr().err
