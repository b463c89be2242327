"""Tensor parallelism failing and stopping (CPU, gloo, 2 ranks): a dead rank fails every
request fast, with its exit named; `close()` leaves no process behind."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from engine_helpers import prompt_logits
from tp_helpers import run_after_a_rank_died, tp2_engine

from openinfer_core import Engine, EngineConfig, GenerateRequest, SamplingParams
from openinfer_core.distributed import TensorParallelModel
from openinfer_core.interfaces.model import ModelFailedError

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def random_prompts(n: int, seed: int, lengths: tuple[int, int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, 151000) for _ in range(rng.randint(*lengths))]
            for _ in range(n)]


@pytest.mark.timeout(120)
def test_dead_worker_fails_every_request_fast(qwen3_dir: Path) -> None:
    """A worker killed mid-generation: every request ends with an error naming the dead rank
    (or, once the engine stops on `ModelFailedError`, the step raises it); nothing hangs."""
    engine = tp2_engine(qwen3_dir)
    model = engine.model
    assert isinstance(model, TensorParallelModel)
    try:
        for i, ids in enumerate(random_prompts(3, seed=5, lengths=(5, 20))):
            engine.add_request(GenerateRequest(f"k{i}", tuple(ids), GREEDY))
        for _ in range(3):
            engine.step()
        worker = model.workers[0].process
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        run_after_a_rank_died(engine, ["k0", "k1", "k2"])
        with pytest.raises(ModelFailedError, match="exited with code -9"):
            prompt_logits(engine, [1, 2, 3])
    finally:
        model.close()
    assert not dist.is_initialized()


@pytest.mark.timeout(120)
def test_worker_dying_inside_a_collective_fails_the_step(qwen3_dir: Path) -> None:
    """The worker dies after rank 0 checked it was alive, while rank 0 is in the step's
    collectives: gloo sees the connection close; the step raises at once, naming the rank."""
    engine = tp2_engine(qwen3_dir)
    model = engine.model
    assert isinstance(model, TensorParallelModel)
    try:
        prompt_logits(engine, [5, 6, 7])
        worker = model.workers[0].process
        broadcast = model.group.broadcast

        def kill_then_broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
            assert worker.pid is not None
            os.kill(worker.pid, signal.SIGKILL)
            worker.join(10)
            return broadcast(x, src)

        model.group.broadcast = kill_then_broadcast  # type: ignore[method-assign]
        with pytest.raises(ModelFailedError, match="rank 1 .* exited with code -9"):
            prompt_logits(engine, [5, 6, 7])
        with pytest.raises(ModelFailedError, match="tensor parallelism failed"):
            prompt_logits(engine, [5, 6, 7])  # and every step after it
    finally:
        model.close()


def test_close_stops_every_worker(qwen3_dir: Path) -> None:
    engine = tp2_engine(qwen3_dir)
    model = engine.model
    assert isinstance(model, TensorParallelModel)
    processes = [w.process for w in model.workers]
    model.close()
    model.close()  # idempotent
    assert [p.exitcode for p in processes] == [0]
    assert not [p for p in multiprocessing.active_children() if p in processes]
    assert not dist.is_initialized()


@pytest.mark.timeout(120)
def test_engine_config_route_stops_on_a_dead_rank(qwen3_dir: Path) -> None:
    """`EngineConfig(tensor_parallel_size=2)`: the engine loads over 2 ranks, stops (raises)
    when one dies, and `close()` ends the rest."""
    config = EngineConfig(model=str(qwen3_dir), device="cpu", tensor_parallel_size=2)
    engine = Engine(config)
    model = engine.model
    assert isinstance(model, TensorParallelModel)
    try:
        engine.add_request(GenerateRequest("r", (11, 12, 13), GREEDY))
        engine.step()
        worker = model.workers[0].process
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        with pytest.raises(ModelFailedError, match="exited with code -9"):
            for _ in range(10):
                engine.step()
    finally:
        engine.close()
    assert not dist.is_initialized()
