"""A lone UTF-16 surrogate anywhere in a request body (valid JSON, invalid Unicode) is a 400
naming the field, on every route; it never reaches the tokenizer or the engine."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from live_server import MODEL, LiveServer, error_of

from openinfer_server.surrogates import lone_surrogate_path

LONE = "\ud800"
USER = {"role": "user", "content": "Hi"}


def post_raw(server: LiveServer, path: str, body: Any) -> httpx.Response:
    # json.dumps writes the surrogate as the escape "\ud800", as a client's JSON library would;
    # httpx's json= would try (and fail) to encode it as UTF-8 first.
    return httpx.post(f"{server.url}{path}", content=json.dumps(body),
                      headers={"content-type": "application/json"}, timeout=30)


@pytest.mark.parametrize(("path", "body", "where"), [
    ("/v1/completions", {"prompt": f"a{LONE}b"}, "prompt"),
    ("/v1/completions", {"prompt": ["fine", LONE]}, "prompt[1]"),
    ("/v1/completions", {"prompt": "Hi", "stop": ["ok", f"x{LONE}"]}, "stop[1]"),
    ("/v1/completions", {"prompt": "Hi", "stop": LONE}, "stop"),
    ("/v1/chat/completions", {"messages": [USER, {"role": "user", "content": LONE}]},
     "messages[1].content"),
    ("/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]},
     "messages[0].content[0].text"),
    ("/v1/chat/completions", {"messages": [USER], "stop": [LONE]}, "stop[0]"),
    ("/v1/chat/completions", {"messages": [USER], "tools": [{"function": {"name": LONE}}]},
     "tools[0].function.name"),
    ("/v1/chat/completions",
     {"messages": [USER], "chat_template_kwargs": {f"k{LONE}": True}},
     "chat_template_kwargs.k\\ud800"),
    ("/tokenize", {"prompt": LONE}, "prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": LONE}]}, "messages[0].content"),
])
def test_lone_surrogate_is_a_400_naming_the_field(server: LiveServer, path: str,
                                                  body: dict[str, Any], where: str) -> None:
    err = error_of(post_raw(server, path, {"model": MODEL, "max_tokens": 2, **body}), 400)
    assert err["param"] == where.split(".")[0].split("[")[0]
    assert err["message"].startswith(f"invalid request: {where}: holds a lone UTF-16 "
                                     "surrogate"), err
    server.wait_idle()


def test_paired_surrogates_are_ordinary_text(server: LiveServer) -> None:
    # json.dumps spells the emoji as the pair "\ud83d\ude00": one character, not two lone
    # surrogates.
    assert "\\ud83d\\ude00" in json.dumps("\U0001F600")
    response = post_raw(server, "/tokenize", {"prompt": "\U0001F600"})
    assert response.status_code == 200, response.text
    assert response.json()["count"] >= 1


def test_lone_surrogate_path() -> None:
    assert lone_surrogate_path({"a": ["x", 1, {"b": "é"}], "c": list(range(5))}) is None
    assert lone_surrogate_path({"a": [1, {"b": f"é{LONE}"}]}) == "a[1].b"
    assert lone_surrogate_path([0, "\udfff"]) == "[1]"
    assert lone_surrogate_path({"a": {LONE: 1}}) == "a.\\ud800"
