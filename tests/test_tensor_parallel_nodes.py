"""Tensor parallelism over two "nodes" on loopback (CPU, gloo): node 0 is this test's engine,
node 1 a separate `openinfer serve --node-rank 1` process, as a user starts it on another host.
The tokens equal one process's; node 1 ends when node 0 stops, and a dead node 1 fails every
request instead of hanging."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_helpers import run_staggered, tokens_of
from test_tensor_parallel import GREEDY, random_prompts
from tp_helpers import run_after_a_rank_died

from openinfer_core import Engine, EngineConfig, GenerateRequest
from openinfer_core.distributed import TensorParallelModel
from openinfer_core.errors import InvalidParameterError
from openinfer_server.cli import torchrun_defaults

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_node1(port: int) -> subprocess.Popen[bytes]:
    """`openinfer serve --node-rank 1`: it waits for node 0's store, then runs rank 1."""
    return subprocess.Popen(
        [sys.executable, "-m", "openinfer_server.cli", "serve", "--device", "cpu",
         "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1",
         "--master-addr", "127.0.0.1", "--master-port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


@pytest.fixture
def two_nodes(qwen3_dir: Path) -> Iterator[tuple[Engine, subprocess.Popen[bytes]]]:
    port = free_port()
    node1 = start_node1(port)
    engine = None
    try:
        engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", tensor_parallel_size=2,
                                     nnodes=2, node_rank=0, master_addr="127.0.0.1",
                                     master_port=port))
        yield engine, node1
    finally:
        if engine is not None:
            engine.model.close()  # type: ignore[attr-defined]
        if node1.poll() is None:
            try:
                node1.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(node1.pid, signal.SIGKILL)
                node1.wait()


@pytest.mark.timeout(300)
def test_two_nodes_give_one_process_tokens(qwen3_dir: Path,
                                           two_nodes: tuple[Engine, subprocess.Popen[bytes]]
                                           ) -> None:
    """Eight requests joining at different steps: rank 1 on "node 1" (its own `openinfer serve`
    process, TCP store, ZeroMQ over TCP) gives the tokens of one rank; stopping node 0's
    model ends node 1 cleanly (exit 0)."""
    engine, node1 = two_nodes
    assert isinstance(engine.model, TensorParallelModel)
    prompts = random_prompts(8, seed=11, lengths=(3, 30))
    requests = [GenerateRequest(f"n{i}", tuple(p), GREEDY) for i, p in enumerate(prompts)]
    got = run_staggered(engine, requests, lambda i: i)
    one = Engine(EngineConfig(model=str(qwen3_dir), device="cpu"))
    want = run_staggered(one, requests, lambda i: i)
    for r in requests:
        assert len(tokens_of(got[r.request_id])) == GREEDY.max_tokens
        assert tokens_of(got[r.request_id]) == tokens_of(want[r.request_id]), r.request_id
    assert engine.kv.num_used_blocks == 0
    engine.model.close()  # type: ignore[attr-defined]
    assert node1.wait(timeout=60) == 0, node1.stderr.read().decode()[-2000:] if node1.stderr \
        else ""


@pytest.mark.timeout(300)
def test_dead_node_fails_every_request(two_nodes: tuple[Engine, subprocess.Popen[bytes]]
                                       ) -> None:
    """Node 1 killed mid-generation: the requests end with errors (or the step raises
    ModelFailedError, which stops a serving engine); nothing waits on the dead node."""
    engine, node1 = two_nodes
    for i, ids in enumerate(random_prompts(3, seed=5, lengths=(5, 20))):
        engine.add_request(GenerateRequest(f"k{i}", tuple(ids), GREEDY))
    for _ in range(3):
        engine.step()
    os.killpg(node1.pid, signal.SIGKILL)  # the node agent and its rank
    node1.wait(10)
    started = time.monotonic()
    run_after_a_rank_died(engine, ["k0", "k1", "k2"])
    assert time.monotonic() - started < 120


def test_bad_node_layouts_are_refused(qwen3_dir: Path) -> None:
    with pytest.raises(InvalidParameterError, match="do not split evenly"):
        EngineConfig(model=str(qwen3_dir), device="cpu", tensor_parallel_size=3, nnodes=2)
    with pytest.raises(InvalidParameterError, match="node_rank"):
        EngineConfig(model=str(qwen3_dir), device="cpu", tensor_parallel_size=2, nnodes=2,
                     node_rank=2)


def test_torchrun_variables_give_the_node_flags() -> None:
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "GROUP_RANK": "1",
           "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
    assert torchrun_defaults(env) == {"master_addr": "10.0.0.1", "master_port": 29400,
                                      "node_rank": 1, "nnodes": 2}
    assert torchrun_defaults({"NNODES": "4", "NODE_RANK": "3"}) == {"nnodes": 4,
                                                                   "node_rank": 3}
    assert torchrun_defaults({}) == {}


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.timeout(300)
def test_torchrun_launches_both_nodes(qwen3_dir: Path) -> None:
    """The documented torchrun form: one `torchrun ... --no-python openinfer serve` a node,
    torchrun's agent hosting the store. Node 0 answers a completion with rank 1 on node 1;
    SIGTERM to node 0's server ends both jobs with exit 0."""
    import json
    import urllib.request

    torchrun = Path(sys.executable).with_name("torchrun")
    openinfer = Path(sys.executable).with_name("openinfer")
    port, http = free_port(), free_port()
    jobs = [subprocess.Popen(
        [str(torchrun), "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
         "--master-addr", "127.0.0.1", "--master-port", str(port), "--no-python",
         str(openinfer), "serve", str(qwen3_dir), "--device", "cpu", "-tp", "2",
         "--port", str(http)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        for node in (0, 1)]
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http}/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline and jobs[0].poll() is None, "no server"
                time.sleep(0.5)
        body = json.dumps({"model": str(qwen3_dir), "prompt": "hello", "max_tokens": 4})
        request = urllib.request.Request(f"http://127.0.0.1:{http}/v1/completions",
                                         body.encode(), {"Content-Type": "application/json"})
        reply = json.load(urllib.request.urlopen(request, timeout=60))
        assert reply["usage"]["completion_tokens"] == 4
        (server,) = children(jobs[0].pid)
        os.kill(server, signal.SIGTERM)
        for job in jobs:
            assert job.wait(timeout=60) == 0, job.stderr.read().decode()[-2000:] \
                if job.stderr else ""
    finally:
        for job in jobs:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
