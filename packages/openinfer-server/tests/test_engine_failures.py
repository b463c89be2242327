"""What clients see when the engine refuses, fails or dies: a scripted EngineHandle behind the
app."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from live_server import error_of

from openinfer_core.events import (
    Error,
    Finished,
    FinishReason,
    Rejected,
    Scheduled,
    Token,
    TokenEvent,
)
from openinfer_core.handle import EngineHandle, LoadSnapshot, ModelInfo
from openinfer_core.request import GenerateRequest
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.app import build_app

Script = Callable[[GenerateRequest], list[TokenEvent]]


class ScriptedEngine:
    """Plays a fixed list of events per request; records aborts."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.aborted: list[str] = []
        self.closed_early: list[str] = []
        self.died: str | None = None  # what `dead` reports

    @property
    def model_info(self) -> ModelInfo:
        return ModelInfo("scripted", 64, 100, 16, (151645,))

    @property
    def dead(self) -> str | None:
        return self.died

    def load(self) -> LoadSnapshot:
        return LoadSnapshot(0, 0, 0, 100)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenEvent]:
        events = self.script(request)
        done = False
        try:
            for event in events:
                await asyncio.sleep(0)
                done = isinstance(event, Finished | Error | Rejected)
                yield event
        finally:
            if not done:
                self.closed_early.append(request.request_id)


def _tokens(request: GenerateRequest, ids: list[int]) -> list[TokenEvent]:
    rid = request.request_id
    return [Scheduled(rid, len(request.prompt_token_ids), 0),
            *(Token(rid, t) for t in ids)]


def _call(engine: ScriptedEngine, tokenizer: Tokenizer, path: str,
          body: dict[str, Any] | None) -> httpx.Response:
    """POST `body` to `path` (GET without a body)."""
    assert isinstance(engine, EngineHandle)
    app = build_app(engine, tokenizer, served_model_names=["m"])

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            if body is None:
                return await client.get(path)
            return await client.post(path, json=body)

    return asyncio.run(go())


BODY = {"prompt": "Hello", "max_tokens": 4}


def test_rejected_is_400_with_the_engine_message(tokenizer: Tokenizer) -> None:
    engine = ScriptedEngine(lambda r: [Rejected(r.request_id, "needs 99 KV blocks")])
    for stream in (False, True):
        r = _call(engine, tokenizer, "/v1/completions", {**BODY, "stream": stream})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "needs 99 KV blocks"


def test_error_is_500_with_the_engine_message(tokenizer: Tokenizer) -> None:
    engine = ScriptedEngine(lambda r: [*_tokens(r, [9707]), Error(r.request_id, "CUDA boom")])
    r = _call(engine, tokenizer, "/v1/chat/completions",
              {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 500
    err = r.json()["error"]
    assert "CUDA boom" in err["message"] and err["type"] == "server_error"


def test_error_mid_stream_is_an_error_event_then_done(tokenizer: Tokenizer) -> None:
    engine = ScriptedEngine(lambda r: [*_tokens(r, [9707, 11]), Error(r.request_id, "boom")])
    r = _call(engine, tokenizer, "/v1/completions", {**BODY, "stream": True})
    assert r.status_code == 200
    events = [line.removeprefix("data: ") for line in r.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    assert "boom" in json.loads(events[-2])["error"]["message"]
    assert json.loads(events[0])["choices"][0]["text"] == "Hello"


def test_one_rejected_choice_aborts_its_siblings(tokenizer: Tokenizer) -> None:
    def script(r: GenerateRequest) -> list[TokenEvent]:
        if r.request_id.endswith("-1"):
            return [Rejected(r.request_id, "no")]
        return [*_tokens(r, [1] * 50), Finished(r.request_id, FinishReason.LENGTH, 1, 50)]

    engine = ScriptedEngine(script)
    r = _call(engine, tokenizer, "/v1/completions", {**BODY, "n": 3, "max_tokens": 50})
    assert r.status_code == 400
    assert sorted(a.rsplit("-", 1)[1] for a in engine.closed_early) == ["0", "2"]
    assert {a.rsplit("-", 1)[1] for a in engine.aborted} >= {"0", "2"}


def test_finish_reasons_and_stop_token(tokenizer: Tokenizer) -> None:
    engine = ScriptedEngine(lambda r: [*_tokens(r, [9707]), Finished(
        r.request_id, FinishReason.STOP, len(r.prompt_token_ids), 1, stop_token_id=151645)])
    choice = _call(engine, tokenizer, "/v1/completions", BODY).json()["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == \
        ("Hello", "stop", 151645)


def test_broken_event_order_is_500(tokenizer: Tokenizer) -> None:
    for script in ([Token("x", 1)], [Scheduled("x", 1, 0), Token("x", 1)], []):
        engine = ScriptedEngine(lambda r, s=script: list(s))  # type: ignore[misc]
        r = _call(engine, tokenizer, "/v1/completions", BODY)
        assert r.status_code == 500 and "event order" in r.json()["error"]["message"]


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_a_dead_engine_is_503_with_retry_after(tokenizer: Tokenizer) -> None:
    engine = ScriptedEngine(lambda r: [*_tokens(r, [9707]), Finished(
        r.request_id, FinishReason.LENGTH, len(r.prompt_token_ids), 1)])
    engine.died = "the engine process died"
    for path, body in (("/v1/completions", BODY), ("/v1/chat/completions", CHAT),
                       ("/health", None)):
        for stream in (False, True):
            if body is None and stream:
                continue
            r = _call(engine, tokenizer, path, None if body is None else {**body,
                                                                          "stream": stream})
            err = error_of(r, 503)
            assert (err["code"], err["type"]) == ("engine_dead", "server_error")
            assert "the engine process died" in err["message"]
            assert r.headers["retry-after"] == "5"
    assert engine.closed_early == engine.aborted == []  # refused before reaching the engine
    # What does not need the engine still answers.
    assert _call(engine, tokenizer, "/tokenize", {"prompt": "Hello"}).status_code == 200


def test_death_mid_request_is_503_or_an_error_event(tokenizer: Tokenizer) -> None:
    engine = ScriptedEngine(lambda r: [])

    def dies(r: GenerateRequest) -> list[TokenEvent]:
        engine.died = "the engine process died"  # as the client marks it before failing all
        return [*_tokens(r, [9707]), Error(r.request_id, engine.died)]

    engine.script = dies
    r = _call(engine, tokenizer, "/v1/chat/completions", CHAT)
    assert error_of(r, 503)["code"] == "engine_dead"
    assert r.headers["retry-after"] == "5"
    engine.died = None
    r = _call(engine, tokenizer, "/v1/completions", {**BODY, "stream": True})
    assert r.status_code == 200
    events = [line.removeprefix("data: ") for line in r.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "engine_dead"
