"""Clients that go away mid-request abort their engine requests: KV blocks come back."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Coroutine
from typing import Any

import httpx
from live_server import MODEL, LiveServer
from prometheus_client.parser import text_string_to_metric_families

# Long enough that finishing naturally would take far longer than the idle wait allows.
LONG = 400


def _aborted(server: LiveServer) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "openinfer:request_success_total" \
                    and sample.labels.get("finished_reason") == "abort":
                return sample.value
    return 0.0


def _body(i: int) -> tuple[str, dict]:
    extra = {"ignore_eos": True, "max_tokens": LONG, "model": MODEL, "stream": True,
             "n": 1 + i % 2}
    if i % 2:
        return "/v1/chat/completions", {**extra, "messages": [{"role": "user",
                                                               "content": f"Tell me {i}"}]}
    return "/v1/completions", {**extra, "prompt": f"Story {i}:"}


async def _read_then_leave(url: str, path: str, body: dict, chunks: int) -> int:
    """Read `chunks` SSE events, then drop the connection. Returns events read."""
    read = 0
    async with httpx.AsyncClient(timeout=30) as client, \
            client.stream("POST", f"{url}{path}", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                assert line != "data: [DONE]"
                read += 1
                if read >= chunks:
                    break
    return read


async def _leave_after(url: str, path: str, body: dict, seconds: float) -> None:
    """Give up after `seconds`, wherever the request is (even before the headers)."""
    try:
        async with httpx.AsyncClient() as client:
            await asyncio.wait_for(client.post(f"{url}{path}", json=body), timeout=seconds)
    except TimeoutError:
        return
    raise AssertionError("a long request finished before the client gave up")


def test_disconnects_free_everything(server: LiveServer) -> None:
    rng = random.Random(1234)
    server.wait_idle()
    before = _aborted(server)

    async def scenario() -> int:
        jobs: list[Coroutine[Any, Any, Any]] = []
        started = 0
        for i in range(36):
            path, body = _body(i)
            kind = i % 3
            if kind == 0:
                jobs.append(_read_then_leave(server.url, path, body, rng.randint(1, 12)))
                started += body["n"]
            elif kind == 1:  # non-streamed, abandoned mid-generation or while queued
                jobs.append(_leave_after(server.url, path, {**body, "stream": False},
                                         rng.uniform(0.05, 1.0)))
            else:  # streamed, abandoned at a random time, maybe before any byte
                jobs.append(_leave_after(server.url, path, body, rng.uniform(0.0, 1.0)))
        await asyncio.gather(*jobs)
        return started

    started = asyncio.run(scenario())
    t0 = time.monotonic()
    server.wait_idle(timeout=5.0)
    assert time.monotonic() - t0 < 5.0
    # at least every stream that delivered an event was aborted (not finished naturally)
    assert _aborted(server) - before >= started
    # and the server still answers
    r = httpx.post(f"{server.url}/v1/completions",
                   json={"model": MODEL, "prompt": "still there?", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def test_stop_string_frees_kv(server: LiveServer) -> None:
    """A stop-string hit ends the engine request too, long before max_tokens."""
    body = {"model": MODEL, "prompt": "Once", "max_tokens": 30, "temperature": 0,
            "ignore_eos": True}
    free = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30).json()
    text = free["choices"][0]["text"]
    stop = text[2:4]
    server.wait_idle()
    before = _aborted(server)
    cut = httpx.post(f"{server.url}/v1/completions",
                     json={**body, "stop": stop, "max_tokens": LONG}, timeout=30).json()
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] < 30
    server.wait_idle(timeout=2.0)
    assert _aborted(server) == before  # a stop hit is a finish, counted as stop
