"""Fast start: the start-up cache of the step's memory, the compile-ahead stamps, the CUDA
graphs left for idle time, and the engine's idle work (all on CPU: graphs and kernels are
stood in for by fakes), and the pending graphs a step under load captures."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.cuda_graphs import (
    CudaGraphRunner,
    graph_buckets,
    mixed_buckets,
    pick_bucket,
    start_buckets,
)
from openinfer_core.engine.engine import Engine
from openinfer_core.interfaces.model import ModelFailedError
from openinfer_core.params import SamplingParams
from openinfer_core.plugins import PluginManager
from openinfer_core.request import GenerateRequest
from openinfer_core.startup import bring_up as bring_up_module
from openinfer_core.startup import compile_plan, kernel_compilers, measurement_cache
from openinfer_core.startup.compile_plan import plan_compile
from openinfer_core.startup.host_memory import release_host_memory, resident_bytes
from openinfer_core.startup.kernel_compilers import KernelCompilers
from openinfer_core.startup.memory_budget import StepMemory
from openinfer_core.startup.prefetch import prefetch_checkpoint, start_device
from openinfer_kernels import plugin as kernels_plugin

KEY = {"hf_config": {"hidden_size": 64}, "max_num_batched_tokens": 8192, "device": "H100"}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(measurement_cache.DIR_ENV, str(tmp_path))
    monkeypatch.delenv(measurement_cache.CACHE_ENV, raising=False)
    return tmp_path


def test_a_stored_peak_reads_back_for_the_same_key_only(cache: Path) -> None:
    assert measurement_cache.load("step-memory", KEY) is None
    measurement_cache.store("step-memory", KEY, 3 << 30)
    assert measurement_cache.load("step-memory", KEY) == 3 << 30
    for changed in ({**KEY, "max_num_batched_tokens": 4096}, {**KEY, "device": "H200"},
                    {**KEY, "hf_config": {"hidden_size": 65}}):
        assert measurement_cache.load("step-memory", changed) is None
    assert measurement_cache.load("other-kind", KEY) is None


def test_a_file_whose_key_or_value_is_wrong_is_ignored(cache: Path) -> None:
    measurement_cache.store("step-memory", KEY, 1 << 30)
    (path,) = cache.glob("step-memory-*.json")
    entry = json.loads(path.read_text())
    for bad in ({**entry, "key": {**KEY, "device": "H200"}}, {**entry, "value": -1},
                {**entry, "value": "big"}, {**entry, "value": True},
                {**entry, "schema": measurement_cache.SCHEMA + 1}):
        path.write_text(json.dumps(bad))
        assert measurement_cache.load("step-memory", KEY) is None
    path.write_text("{not json")
    assert measurement_cache.load("step-memory", KEY) is None


def test_drop_and_the_off_switch(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    measurement_cache.store("step-memory", KEY, 1 << 30)
    measurement_cache.drop("step-memory", KEY)
    assert measurement_cache.load("step-memory", KEY) is None
    monkeypatch.setenv(measurement_cache.CACHE_ENV, "0")
    measurement_cache.store("step-memory", KEY, 1 << 30)
    assert not list(cache.iterdir())


def test_a_cached_peak_is_budgeted_with_a_margin() -> None:
    peak = 2 << 30
    assert measurement_cache.with_margin(peak) >= peak * 1.1 + (128 << 20) - 1


def test_kernel_env_leaves_out_places_and_start_up_switches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENINFER_LINEAR", "cublas")
    monkeypatch.setenv("OPENINFER_CACHE_DIR", "/tmp/x")
    monkeypatch.setenv("OPENINFER_COMPILE_AHEAD", "1")
    env = measurement_cache.kernel_env()
    assert env["OPENINFER_LINEAR"] == "cublas"
    assert "OPENINFER_CACHE_DIR" not in env and "OPENINFER_COMPILE_AHEAD" not in env


@pytest.mark.parametrize("max_batch, max_tokens, expected", [
    (256, 2048, {("decode", 1), ("decode", 2), ("decode", 4), ("decode", 8), ("decode", 16),
                 ("decode", 256), ("mixed", 2048)}),
    (3, 0, {("decode", 1), ("decode", 2), ("decode", 3)}),
])
def test_start_buckets(max_batch: int, max_tokens: int,
                       expected: set[tuple[str, int]]) -> None:
    assert start_buckets(graph_buckets(max_batch), mixed_buckets(max_tokens)) == expected


@pytest.mark.parametrize("n, captured, expected", [
    (5, {1, 2, 4, 8, 16, 256}, 8),  # its own bucket
    (20, {1, 2, 4, 8, 16, 256}, None),  # 256 pads 32 eightfold: eager
    (20, {1, 2, 4, 8, 16, 48, 256}, 48),  # 48 <= 2 x 32
    (33, {1, 2, 4, 8, 16, 64, 256}, 64),
    (257, {256}, None),  # past the largest bucket
    (1, set(), None),
])
def test_pick_bucket(n: int, captured: set[int], expected: int | None) -> None:
    assert pick_bucket(graph_buckets(256), captured, n) == expected


class _FakeCudaModel:
    device = torch.device("cuda")
    compile_ahead_safe = True


def _triton_compiler() -> KernelCompilers:
    """openinfer-kernels' compiler, registered through its plugin as the engine finds it."""
    return KernelCompilers.from_plugins(PluginManager(autoload=False, plugins=[kernels_plugin]))


def test_compile_ahead_auto_runs_once_per_setup(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(kernel_compilers.MODE_ENV, raising=False)
    model: Any = _FakeCudaModel()
    compilers = _triton_compiler()
    plan = plan_compile(model, KEY, compilers)
    assert plan.active  # cold: compile ahead
    plan.finish()
    assert not plan.active
    assert list((tmp_path / compile_plan.STAMPS).iterdir())
    assert compilers.compiled()  # and the install's mark: workers need not start early
    assert not plan_compile(model, KEY, compilers).active  # warm: the stamp is there
    assert plan_compile(model, {**KEY, "max_num_batched_tokens": 1}, compilers).active
    monkeypatch.setenv(kernel_compilers.MODE_ENV, "1")
    assert plan_compile(model, KEY, compilers).active
    monkeypatch.setenv(kernel_compilers.MODE_ENV, "0")
    plan = plan_compile(model, {**KEY, "max_num_batched_tokens": 2}, compilers)
    assert not plan.active
    plan.finish()  # nothing planned: no stamp
    assert len(list((tmp_path / compile_plan.STAMPS).iterdir())) == 1


def test_compile_ahead_is_off_on_the_cpu() -> None:
    model: Any = SimpleNamespace(device=torch.device("cpu"), compile_ahead_safe=True)
    assert not plan_compile(model, {}, _triton_compiler()).active


def test_compile_ahead_needs_the_model_to_declare_it_and_a_compiler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(kernel_compilers.MODE_ENV, "1")
    undeclared: Any = SimpleNamespace(device=torch.device("cuda"))
    assert not plan_compile(undeclared, KEY, _triton_compiler()).active
    declined: Any = SimpleNamespace(device=torch.device("cuda"), compile_ahead_safe=False)
    assert not plan_compile(declined, KEY, _triton_compiler()).active
    assert not plan_compile(_FakeCudaModel(), KEY, KernelCompilers()).active


class _FakeGraphs:
    """Stands in for CudaGraphRunner's idle-capture interface."""

    def __init__(self, pending: list[tuple[str, int]]) -> None:
        self.pending = list(pending)
        self.captured: list[tuple[str, int]] = []
        self.captured_under_load = False

    def capture_next(self) -> bool:
        self.captured.append(self.pending.pop(0))
        return bool(self.pending)


def test_idle_work_frees_host_memory_then_captures_one_graph_per_call(qwen3_dir: Path) -> None:
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", num_kv_blocks=64),
                    defer_graphs=True)
    fake = _FakeGraphs([("decode", 32), ("mixed", 64)])
    engine.graphs = fake  # type: ignore[assignment]
    assert engine.idle_work()  # host memory; graphs still pending
    assert fake.captured == []
    engine.add_request(GenerateRequest("r", (1, 2, 3)))
    assert not engine.idle_work()  # a request waits: no capture
    while engine.has_work():
        engine.step()
    assert engine.idle_work() and fake.captured == [("decode", 32)]
    assert not engine.idle_work() and fake.captured == [("decode", 32), ("mixed", 64)]
    assert not engine.idle_work()


def _bucket_logic_runner(pending: list[tuple[str, int]]) -> Any:
    """A CudaGraphRunner's bucket bookkeeping without its device buffers (CPU): buckets up
    to 256 rows and 512 mixed tokens, tables 8 blocks wide; captures recorded, not made."""
    runner: Any = object.__new__(CudaGraphRunner)
    runner.buckets, runner.mixed, runner.max_batch = graph_buckets(256), mixed_buckets(512), 256
    runner.block_tables = torch.zeros(256, 8, dtype=torch.int32)
    runner.pending = list(pending)
    runner.captured = []
    runner.captured_under_load = False
    runner.capture_seconds = 0.0

    def capture_pending(key: tuple[str, int]) -> None:
        runner.pending.remove(key)
        runner.captured.append(key)

    runner._capture_pending = capture_pending
    return runner


def _step(seqs: int, tokens: int | None = None, width: int = 8) -> SimpleNamespace:
    return SimpleNamespace(is_decode=tokens is None, num_seqs=seqs,
                           input_ids=np.zeros(tokens or seqs, dtype=np.int64),
                           block_tables=np.zeros((seqs, width), dtype=np.int32))


def test_a_step_under_load_captures_its_own_pending_bucket_once() -> None:
    runner = _bucket_logic_runner([("decode", 32), ("decode", 48), ("mixed", 64)])
    assert runner.own_key(_step(20)) == ("decode", 32)
    assert runner.own_key(_step(3, tokens=40)) == ("mixed", 64)
    assert runner.own_key(_step(3, tokens=600)) is None  # past the largest mixed graph
    assert runner.own_key(_step(3, tokens=40, width=9)) is None  # tables wider than the graph's
    assert runner.own_key(_step(300)) is None  # past the largest decode bucket
    assert runner.capture_for(_step(20)) and runner.captured == [("decode", 32)]
    assert not runner.capture_for(_step(17))  # the same bucket: captured already
    assert not runner.capture_for(_step(8))  # a start bucket, never pending
    assert runner.capture_for(_step(3, tokens=40))
    assert runner.captured == [("decode", 32), ("mixed", 64)]
    assert runner.pending == [("decode", 48)] and runner.captured_under_load


def test_a_capture_that_fails_under_load_leaves_the_step_eager() -> None:
    runner = _bucket_logic_runner([("decode", 32), ("decode", 48)])

    def out_of_memory(key: tuple[str, int]) -> None:
        runner.pending.remove(key)
        raise torch.OutOfMemoryError("CUDA out of memory")

    runner._capture_pending = out_of_memory
    assert not runner.capture_for(_step(20))  # the step runs eagerly; the engine goes on
    assert runner.pending == [("decode", 48)] and not runner.captured_under_load

    def rank_failed(key: tuple[str, int]) -> None:
        raise ModelFailedError("a tensor-parallel rank died")

    runner._capture_pending = rank_failed
    with pytest.raises(ModelFailedError):  # no step can run: the engine stops
        runner.capture_for(_step(40))


class _StepGraphs:
    """Stands in for CudaGraphRunner's per-step interface: records what the runner asks, and
    has no graph for any step (so every step runs eagerly)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    def capture_for(self, batch: Any) -> bool:
        self.asked.append(("capture_for", batch.num_seqs))
        return False

    def can_run(self, batch: Any) -> bool:
        self.asked.append(("can_run", batch.num_seqs))
        return False


def test_each_step_offers_its_bucket_for_capture_before_it_picks_a_graph(
        qwen3_dir: Path) -> None:
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", num_kv_blocks=64))
    graphs = _StepGraphs()
    engine.runner.graphs = graphs  # type: ignore[assignment]
    engine.add_request(GenerateRequest("r", (1, 2, 3), SamplingParams(max_tokens=3)))
    while engine.has_work():
        engine.step()
    assert graphs.asked and graphs.asked[:2] == [("capture_for", 1), ("can_run", 1)]
    assert [kind for kind, _ in graphs.asked[::2]] == ["capture_for"] * (len(graphs.asked) // 2)


def test_a_cached_step_memory_that_runs_out_is_dropped(
        qwen3_dir: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    measurement_cache.store("step-memory", KEY, 1 << 20)

    def cached_step(*args: object) -> StepMemory:
        return StepMemory(1 << 20, KEY)  # as if read from the cache

    def out_of_memory(*args: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(bring_up_module, "step_memory", cached_step)
    monkeypatch.setattr(bring_up_module, "warm_up_eager_steps", out_of_memory)
    with pytest.raises(RuntimeError, match="the entry is dropped"):
        Engine(EngineConfig(model=str(qwen3_dir), device="cpu", num_kv_blocks=64))
    assert measurement_cache.load("step-memory", KEY) is None


def test_idle_work_without_graphs(qwen3_dir: Path) -> None:
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", num_kv_blocks=64),
                    defer_graphs=True)
    assert engine.graphs is None
    assert not engine.idle_work() and not engine.idle_work()


def test_release_host_memory_keeps_what_is_live() -> None:
    live = torch.arange(1 << 16)
    release_host_memory()
    assert int(live[-1]) == (1 << 16) - 1
    rss = resident_bytes()
    assert rss is None or rss > 0


def test_prefetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        (tmp_path / name).write_bytes(b"\0" * 40_000)
    opened: list[str] = []
    real_open = open

    def watched_open(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(Path(path).name)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", watched_open)
    monkeypatch.setattr("openinfer_core.startup.prefetch.PREFETCH_CHUNK", 16_384)
    thread = prefetch_checkpoint(tmp_path, "auto")
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive()
    # Both shards read, in the loader's order (meminfo is opened first for the budget).
    assert [n for n in opened if n.endswith(".safetensors")] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    # With memory for less than one shard, the read-ahead stops inside the first.
    opened.clear()
    monkeypatch.setattr("openinfer_core.startup.prefetch._available_memory", lambda: 50_000)
    thread = prefetch_checkpoint(tmp_path, "auto")
    assert thread is not None
    thread.join(5)
    assert [n for n in opened if n.endswith(".safetensors")] == [
        "model-00001-of-00002.safetensors"]
    assert prefetch_checkpoint(tmp_path, "dummy") is None
    assert prefetch_checkpoint(tmp_path / "empty", "auto") is None
    assert start_device("cpu") is None
