"""CPU intra-op threads: the cores this process may use, shared among the processes of a node
that compute at once, or OMP_NUM_THREADS when it is set."""

from __future__ import annotations

import pytest
import torch

from openinfer_core import cpu_threads
from openinfer_core.engine.config import EngineConfig


@pytest.fixture
def eight_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_threads.os, "sched_getaffinity", lambda pid: set(range(8)),
                        raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


@pytest.mark.usefixtures("eight_cores")
@pytest.mark.parametrize(("processes", "threads"), [(1, 8), (2, 4), (3, 2), (8, 1), (20, 1)])
def test_cores_are_shared_out(processes: int, threads: int) -> None:
    assert cpu_threads.threads_per_process(processes) == threads


@pytest.mark.usefixtures("eight_cores")
@pytest.mark.parametrize(("value", "threads"), [("3", 3), ("16", 16), ("0", 4), ("x", 4),
                                                ("", 4)])
def test_an_explicit_omp_num_threads_wins(monkeypatch: pytest.MonkeyPatch, value: str,
                                          threads: int) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert cpu_threads.threads_per_process(2) == threads  # a value that is no count: ignored


@pytest.mark.usefixtures("eight_cores")
def test_share_cores_sets_torch_threads() -> None:
    before = torch.get_num_threads()
    try:
        assert cpu_threads.share_cores(4) == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_node_counts_its_ranks_replicas_and_frontends() -> None:
    config = EngineConfig(model="m", device="cpu", tensor_parallel_size=2,
                          data_parallel_size=3, other_processes=2)
    assert config.cpu_processes() == 2 * 3 + 2
    # A replica's engine runs one replica, and counts the other two replicas' ranks as others.
    replica = config.replica(1)
    assert replica.data_parallel_size == 1
    assert replica.cpu_processes() == config.cpu_processes()
    # Over two nodes, each holds half of the ranks.
    two_nodes = EngineConfig(model="m", device="cpu", tensor_parallel_size=4, nnodes=2)
    assert two_nodes.cpu_processes() == 2
