"""Two data-parallel replicas behind one app, as `openinfer serve --data-parallel-size 2` runs
them: greedy output as one engine gives it, requests spread over both replicas, a
conversation's second turn on its first turn's replica with a prefix-cache hit, /metrics per
replica; and, as processes, a killed replica failing only its own stream, and second turns
that find their first turn's replica through two frontends' shared prefix table."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from live_server import MODEL, LiveServer, openinfer_command, serve_in_thread, wait_for_ready
from processes import children, comm, wait_gone
from prometheus_client.parser import text_string_to_metric_families

from openinfer_core.engine.config import EngineConfig
from openinfer_core.handle import LoadSnapshot, ModelInfo
from openinfer_core.interfaces.kv import PrefixCacheStats
from openinfer_core.interfaces.offload import RESTORE_BUCKETS, OffloadStats, TierStats
from openinfer_core.ipc import EngineClient, EngineProcess, ReplicaRouter
from openinfer_core.ipc.affinity import SharedAffinity
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server import frontend as frontend_module
from openinfer_server.app import build_app
from openinfer_server.frontend import Frontend
from openinfer_server.metrics import ServerMetrics

GREEDY: dict[str, Any] = {"model": MODEL, "temperature": 0.0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def dp_server(checkpoint: Path, tokenizer: Tokenizer) -> Iterator[LiveServer]:
    config = EngineConfig(model=str(checkpoint), device="cpu", data_parallel_size=2)
    engines = EngineProcess.start_many([config.replica(r) for r in range(2)], "warning")
    clients = [EngineClient(e.addresses, sentinel=e.sentinel) for e in engines]
    router = ReplicaRouter(clients)
    url, server, thread = serve_in_thread(build_app(router, tokenizer,
                                                    served_model_names=[MODEL]))
    yield LiveServer(url, server.config.app, router, tokenizer)
    server.should_exit = True
    thread.join(timeout=10)
    for client in clients:
        client.close()
    for engine in engines:
        engine.stop()


def _per_replica(server: LiveServer, name: str) -> dict[str, float]:
    """Sample `name` of /metrics by replica label; every sample must carry one."""
    text = httpx.get(f"{server.url}/metrics").text
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name]
    assert all(set(s.labels) == {"model_name", "replica"} for s in samples), samples
    return {s.labels["replica"]: s.value for s in samples}


def _moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {r: after[r] - before[r] for r in after}


def test_greedy_output_matches_one_engine(server: LiveServer, dp_server: LiveServer) -> None:
    one, two = server.client(), dp_server.client()
    for i in range(4):  # one after another: ties go to each replica in turn
        prompt = f"Replica check {i}: " + "lorem ipsum " * (3 * i)
        alone = one.completions.create(prompt=prompt, max_tokens=8, **GREEDY)
        routed = two.completions.create(prompt=prompt, max_tokens=8, **GREEDY)
        assert routed.choices[0].text == alone.choices[0].text
        assert routed.usage == alone.usage


def test_requests_spread_and_metrics_per_replica(dp_server: LiveServer) -> None:
    dp_server.wait_idle()
    queries = "openinfer:prefix_cache_queries_total"
    before = _per_replica(dp_server, queries)
    assert set(before) == {"0", "1"}
    for name in ("openinfer:num_requests_running", "openinfer:num_requests_waiting",
                 "openinfer:kv_cache_usage_perc", "openinfer:prefix_cache_hits_total",
                 "openinfer:num_preemptions_total"):
        assert set(_per_replica(dp_server, name)) == {"0", "1"}, name
    client = dp_server.async_client()
    prompt_len = 10  # under one block: no prefix to follow, load alone decides

    async def burst() -> None:
        await asyncio.gather(*(client.completions.create(
            prompt=[7000 + 100 * i + j for j in range(prompt_len)], max_tokens=24, **GREEDY)
            for i in range(8)))

    asyncio.run(burst())
    dp_server.wait_idle()
    per_replica = {r: n / prompt_len for r, n in
                   _moved(before, _per_replica(dp_server, queries)).items()}
    assert sum(per_replica.values()) == 8
    assert min(per_replica.values()) >= 2, per_replica


def test_second_turn_lands_on_the_first_turns_replica(dp_server: LiveServer,
                                                      tokenizer: Tokenizer) -> None:
    dp_server.wait_idle()
    client = dp_server.client()
    extra = {"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True}
    turn1 = [{"role": "user", "content": "Tell me about the data parallel replicas of a "
              "serving engine: how requests find them, what each one keeps in its prefix "
              "cache, and why the second turn of a conversation should come back to it."}]
    hits, queries = "openinfer:prefix_cache_hits_total", "openinfer:prefix_cache_queries_total"
    before = _per_replica(dp_server, queries)
    first = client.chat.completions.create(messages=turn1, max_tokens=6,  # type: ignore[arg-type]
                                           model=MODEL, temperature=0.0, extra_body=extra)
    [replica] = [r for r, n in _moved(before, _per_replica(dp_server, queries)).items() if n]
    turn2 = [*turn1, {"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "And when one of them dies?"}]
    shared = _common_prefix(*(tokenizer.encode(tokenizer.apply_chat_template(
        turn, enable_thinking=False), add_special_tokens=False) for turn in (turn1, turn2)))
    assert shared >= 32  # two whole blocks to hit
    dp_server.wait_idle()
    before_hits = _per_replica(dp_server, hits)
    # Without affinity this turn would go to the other replica: ties are taken in turn.
    second = client.chat.completions.create(messages=turn2, max_tokens=6,  # type: ignore[arg-type]
                                            model=MODEL, temperature=0.0, extra_body=extra)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens >= shared // 16 * 16
    moved = _moved(before_hits, _per_replica(dp_server, hits))
    assert moved[replica] >= shared // 16 * 16 and sum(moved.values()) == moved[replica]


class _TwoReplicas:
    """A handle over two replicas as /metrics sees it: their loads, replica 1 with offload."""

    model_info = ModelInfo("m", 64, 100, 16, (0,))
    dead = None
    offload = OffloadStats(tiers=(TierStats("host", hits=3, saved=5),), restores=1,
                           restored_blocks=3, restore_seconds=0.5,
                           restore_buckets=(1,) + (0,) * len(RESTORE_BUCKETS))

    def replica_loads(self) -> list[LoadSnapshot]:
        return [LoadSnapshot(2, 1, 10, 100, PrefixCacheStats(40, 16)),
                LoadSnapshot(0, 0, 4, 100, offload=self.offload)]


def test_metrics_series_per_replica() -> None:
    text = ServerMetrics(_TwoReplicas(), "m").render().decode()  # type: ignore[arg-type]
    for line in ['openinfer:num_requests_running{model_name="m",replica="0"} 2.0',
                 'openinfer:num_requests_running{model_name="m",replica="1"} 0.0',
                 'openinfer:kv_cache_usage_perc{model_name="m",replica="1"} 0.04',
                 'openinfer:prefix_cache_hits_total{model_name="m",replica="0"} 16.0',
                 'openinfer:kv_offload_hits_total{model_name="m",replica="1",tier="host"} 3.0',
                 'openinfer:kv_offload_restored_tokens_total{model_name="m",replica="1"} 48.0',
                 'openinfer:kv_offload_restore_seconds_count{model_name="m",replica="1"} 1.0']:
        assert line in text, line
    assert 'replica="0",tier=' not in text  # replica 0 has no offload tiers


def test_the_launcher_removes_the_shared_prefix_table_on_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []

    def fail(frontend: Frontend, engines: object, count: int, sock: socket.socket,
             affinity: str | None) -> int:
        seen.append(affinity)
        if affinity is not None:
            SharedAffinity.attach(affinity).close()  # there while the frontends run
        raise RuntimeError("a frontend could not start")

    monkeypatch.setattr(frontend_module, "_supervise", fail)
    args = argparse.Namespace(host="127.0.0.1", port=0)
    engine = SimpleNamespace(model_info=ModelInfo("m", 64, 100, 16, (0,)))
    front = Frontend(args, "folder", ["m"], False, 0.0)
    with pytest.raises(RuntimeError, match="could not start"):
        frontend_module.supervise(front, [engine, engine], 2)  # type: ignore[list-item]
    [name] = seen
    assert name is not None
    with pytest.raises(FileNotFoundError):
        SharedAffinity.attach(name)
    with pytest.raises(RuntimeError, match="could not start"):  # one replica: no table
        frontend_module.supervise(front, [engine], 2)  # type: ignore[list-item]
    assert seen == [name, None]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# -- as processes ------------------------------------------------------------------------------
def _stream(url: str, prompt: str, events: list[str]) -> None:
    body = {"model": "m", "prompt": prompt, "max_tokens": 200, "stream": True,
            "ignore_eos": True, "temperature": 0}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))


def _wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize("frontends", [1, 2], ids=["one-frontend", "two-frontends"])
def test_a_killed_replica_fails_only_its_own_stream(checkpoint: Path, tmp_path: Path,
                                                    frontends: int) -> None:
    # Two frontends: each routes on its own, the second seeing the first's request in the
    # engine's count.
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "OPENINFER_API_KEY"}
    port = "0" if frontends == 1 else str(_free_port())
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*openinfer_command(), "serve", str(checkpoint), "--device", "cpu", "--port", port,
             "--served-model-name", "m", "--data-parallel-size", "2",
             "--api-server-count", str(frontends)],
            stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url = wait_for_ready(proc, log, timeout=180)
        _wait_for(lambda: len(re.findall(r"ready in [\d.]+ s: http", log.read_text()))
                  == frontends, 60, "not every frontend came up")
        descendants = children(proc.pid)
        cores = [p for p in descendants if comm(p) == "openinfer-core"]
        assert len(cores) == 2, log.read_text()
        streams: list[list[str]] = [[], []]
        threads = []
        for i, events in enumerate(streams):  # the second starts once the first runs: the
            thread = threading.Thread(target=_stream, args=(url, f"Hello {i}", events))
            thread.start()  # other replica is the less loaded one then
            threads.append(thread)
            _wait_for(lambda e=events: len(e) >= 3, 60, "no tokens streamed")  # type: ignore[misc]
        os.kill(cores[0], signal.SIGKILL)
        killed = time.monotonic()
        _wait_for(lambda: any(s and s[-1] == "[DONE]" for s in streams), 15,
                  "no stream ended within 15 s of the kill")
        assert time.monotonic() - killed < 15
        health = httpx.get(f"{url}/health", timeout=5)
        assert health.status_code == 503, health.text
        for thread in threads:
            thread.join(timeout=60)
        ends = sorted(json.loads(s[-2]).get("error") is None for s in streams)
        assert ends == [False, True], streams  # one error, one finished
        [failed] = [s for s in streams if "error" in json.loads(s[-2])]
        assert "engine process died" in json.loads(failed[-2])["error"]["message"]
        [finished] = [s for s in streams if "error" not in json.loads(s[-2])]
        assert json.loads(finished[-2])["choices"][0]["finish_reason"] == "length"
        assert proc.wait(timeout=60) == 1, log.read_text()
        assert wait_gone(descendants) == [], log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.slow
def test_second_turns_find_their_replica_through_either_frontend(checkpoint: Path,
                                                                  tmp_path: Path) -> None:
    """Each request on a new connection, which either frontend may take: every second turn
    hits its first turn's cached blocks, where routers with tables of their own would send
    about half of those that reach the other frontend to the other replica."""
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "OPENINFER_API_KEY"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*openinfer_command(), "serve", str(checkpoint), "--device", "cpu", "--port",
             str(_free_port()), "--served-model-name", "m", "--data-parallel-size", "2",
             "--api-server-count", "2"],
            stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url = wait_for_ready(proc, log, timeout=180)
        _wait_for(lambda: len(re.findall(r"ready in [\d.]+ s: http", log.read_text())) == 2,
                  60, "not every frontend came up")

        def complete(prompt: list[int]) -> int:
            body = {"model": "m", "prompt": prompt, "max_tokens": 1, "temperature": 0}
            with httpx.Client(timeout=60) as client:  # a new connection each time
                response = client.post(f"{url}/v1/completions", json=body,
                                       headers={"Connection": "close"})
            assert response.status_code == 200, response.text
            return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

        firsts = [[50 + (97 * c + 13 * j) % 900 for j in range(64)] for c in range(16)]
        # At once, so that both frontends take connections (one after another, the same one
        # may take them all); 16 at a time never make a holder too busy.
        with ThreadPoolExecutor(len(firsts)) as pool:
            list(pool.map(complete, firsts))
            cached = list(pool.map(complete, [[*turn1, 1, 2, 3] for turn1 in firsts]))
        assert cached == [64] * len(firsts), cached  # four whole blocks each
    finally:
        proc.terminate()
        proc.wait(60)
