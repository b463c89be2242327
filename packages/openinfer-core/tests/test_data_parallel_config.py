"""`EngineConfig.data_parallel_size`: what is refused, the GPUs every replica's ranks need, and
each replica's device (`replica`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import openinfer_core.engine.config as config_module
from openinfer_core.engine.config import EngineConfig
from openinfer_core.errors import InvalidParameterError

GpuCount = Callable[[int], None]


@pytest.fixture
def set_gpus(monkeypatch: pytest.MonkeyPatch) -> GpuCount:
    """Sets how many GPUs the CUDA driver reports."""

    def set_count(count: int) -> None:
        monkeypatch.setattr(config_module, "_cuda_device_count", lambda: count)

    return set_count


def test_refused_values() -> None:
    with pytest.raises(InvalidParameterError, match="must be an integer >= 1, got 0"):
        EngineConfig(model="m", data_parallel_size=0)
    with pytest.raises(InvalidParameterError, match="replicas run on one node") as info:
        EngineConfig(model="m", data_parallel_size=2, tensor_parallel_size=2, nnodes=2)
    assert info.value.param == "data_parallel_size"


def test_every_replica_needs_its_gpus(set_gpus: GpuCount) -> None:
    set_gpus(4)
    EngineConfig(model="m", device="cuda", data_parallel_size=2, tensor_parallel_size=2
                 ).check_device()
    EngineConfig(model="m", device="auto", data_parallel_size=4).check_device()
    with pytest.raises(InvalidParameterError) as info:
        EngineConfig(model="m", device="cuda:1", data_parallel_size=2, tensor_parallel_size=2
                     ).check_device()
    assert info.value.param == "data_parallel_size"
    assert str(info.value).endswith(
        "2 replicas of 2 GPU(s) each from cuda:1 need GPUs 1..4, but 4 GPU(s) are visible: "
        "lower --data-parallel-size or --tensor-parallel-size")
    with pytest.raises(InvalidParameterError, match="need GPUs 0..4"):
        EngineConfig(model="m", device="auto", data_parallel_size=5).check_device()
    with pytest.raises(InvalidParameterError, match="3 ranks on this node") as info:
        EngineConfig(model="m", device="cuda:2", tensor_parallel_size=3).check_device()
    assert info.value.param == "tensor_parallel_size"
    set_gpus(0)
    EngineConfig(model="m", device="auto", data_parallel_size=4).check_device()  # the CPU
    with pytest.raises(InvalidParameterError, match="no GPU is visible"):
        EngineConfig(model="m", device="cuda", data_parallel_size=2).check_device()


def test_replica_devices(set_gpus: GpuCount) -> None:
    set_gpus(8)
    config = EngineConfig(model="m", device="cuda:1", data_parallel_size=3,
                          tensor_parallel_size=2)
    replicas = [config.replica(r) for r in range(3)]
    assert [r.device for r in replicas] == ["cuda:1", "cuda:3", "cuda:5"]
    assert {(r.data_parallel_size, r.tensor_parallel_size) for r in replicas} == {(1, 2)}
    auto = EngineConfig(model="m", data_parallel_size=2)
    assert [auto.replica(r).device for r in range(2)] == ["cuda:0", "cuda:1"]
    with pytest.raises(ValueError, match="replica 2 of 2"):
        auto.replica(2)
    cpu = EngineConfig(model="m", device="cpu", data_parallel_size=2)
    assert [cpu.replica(r).device for r in range(2)] == ["cpu", "cpu"]
    set_gpus(0)
    assert auto.replica(1).device == "cpu"


def test_one_engine_refuses_replicas() -> None:
    """Replicas are engine processes behind `serve`'s router: an in-process Engine (and LLM)
    says so rather than quietly running one."""
    from openinfer_core.engine.engine import Engine

    with pytest.raises(InvalidParameterError, match="data_parallel_size.*--data-parallel-size"):
        Engine(EngineConfig(model="unused", device="cpu", data_parallel_size=2))
