"""Shutdown as requests see it, in-process against the real engine: once shutdown begins, new
requests get a 503; at the deadline a stream still open gets an error event then [DONE], a
non-streamed request a 503, and their engine requests are aborted, their KV blocks freed.
(test_serve_processes.py sends a real SIGTERM.)"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
from live_server import MODEL, error_of

from openinfer_core.ipc import EngineClient
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.app import build_app
from openinfer_server.state import ServerState

LONG = {"model": MODEL, "prompt": "Hello", "max_tokens": 400, "ignore_eos": True,
        "temperature": 0}


def _events(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.split("\n\n") if line]


def _wait_idle(engine: EngineClient, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        load = engine.load()
        if load.running == load.waiting == load.kv_used_blocks == 0:
            return
        time.sleep(0.02)
    raise AssertionError(f"engine still busy after {timeout}s: {engine.load()}")


def test_the_deadline_ends_open_responses_with_a_word(engine: EngineClient,
                                                       tokenizer: Tokenizer) -> None:
    _wait_idle(engine)
    app = build_app(engine, tokenizer, served_model_names=[MODEL])
    state: ServerState = app.state.openinfer

    async def go() -> tuple[list[httpx.Response], httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app",
                                     timeout=60) as client:
            bodies: list[dict[str, Any]] = [{**LONG, "stream": True}, {**LONG, "stream": True},
                                            LONG]
            calls = [asyncio.ensure_future(client.post("/v1/completions", json=b))
                     for b in bodies]
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 400, "ignore_eos": True, "stream": True}
            calls.append(asyncio.ensure_future(client.post("/v1/chat/completions", json=chat)))
            while engine.load().running < len(calls):  # every request is decoding
                assert not any(c.done() for c in calls), [c.result().text for c in calls
                                                          if c.done()]
                await asyncio.sleep(0.02)
            state.shutdown.begin()
            late = await client.post("/v1/completions", json=LONG)
            health = await client.get("/health")
            await asyncio.sleep(0.2)
            assert not any(c.done() for c in calls)  # begun, not over: they go on
            state.shutdown.end()
            return list(await asyncio.gather(*calls)), late, health

    responses, late, health = asyncio.run(go())
    for r in (late, health):
        assert error_of(r, 503)["message"] == "server shutting down"
        assert r.headers["retry-after"] == "5"
    *streams, plain = responses[:3]
    for r in [*streams, responses[3]]:
        assert r.status_code == 200
        events = _events(r.text)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"] == {
            "message": "server shutting down", "type": "server_error", "param": None,
            "code": "server_shutting_down"}
        assert "choices" in json.loads(events[0])  # tokens came before the cut
    assert error_of(plain, 503)["code"] == "server_shutting_down"
    assert plain.headers["retry-after"] == "5"
    _wait_idle(engine)  # the cut requests were aborted: no KV block left in use
