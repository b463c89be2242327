"""The x-request-id response header: the client's echoed, else a fresh one, on every kind of
response (JSON, streamed, errors, the API-key refusal)."""

from __future__ import annotations

import httpx
import pytest
from live_server import MODEL, LiveServer

COMPLETION = {"model": MODEL, "prompt": "Hello", "max_tokens": 3, "ignore_eos": True}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
        "ignore_eos": True}


@pytest.mark.parametrize(("path", "body", "status"), [
    ("/v1/completions", COMPLETION, 200),
    ("/v1/chat/completions", CHAT, 200),
    ("/v1/completions", {**COMPLETION, "stream": True}, 200),
    ("/v1/chat/completions", {**CHAT, "stream": True}, 200),
    ("/tokenize", {"prompt": "Hello"}, 200),
    ("/v1/completions", {**COMPLETION, "temperature": -1}, 400),
    ("/v1/completions", {**COMPLETION, "model": "nope"}, 404),
], ids=["completion", "chat", "completion-stream", "chat-stream", "tokenize", "400", "404"])
def test_the_clients_request_id_is_echoed(server: LiveServer, path: str, body: dict,
                                          status: int) -> None:
    headers = {"X-Request-Id": "trace-42/abc"}
    with httpx.stream("POST", f"{server.url}{path}", json=body, headers=headers,
                      timeout=30) as response:
        text = response.read().decode()
    assert response.status_code == status, text
    assert response.headers.get_list("x-request-id") == ["trace-42/abc"]
    if body.get("stream"):
        assert response.headers["content-type"].startswith("text/event-stream")
        assert text.rstrip().endswith("data: [DONE]")


def test_a_fresh_request_id_when_the_client_sends_none(server: LiveServer) -> None:
    ids = []
    for _ in range(2):
        with httpx.stream("POST", f"{server.url}/v1/completions", timeout=30,
                          json={**COMPLETION, "stream": True}) as response:
            response.read()
        ids.append(response.headers["x-request-id"])
    ids.append(httpx.get(f"{server.url}/health").headers["x-request-id"])
    ids.append(httpx.get(f"{server.url}/v1/models").headers["x-request-id"])
    assert len(set(ids)) == 4 and all(len(i) == 32 for i in ids), ids


def test_refused_api_key_still_gets_a_request_id(keyed_server: LiveServer) -> None:
    response = httpx.get(f"{keyed_server.url}/v1/models", headers={"x-request-id": "r1"})
    assert response.status_code == 401
    assert response.headers["x-request-id"] == "r1"
