"""OpenAI's deprecated `functions` / `function_call` request fields through the official
openai client: mapped onto tools, answered in the legacy `message.function_call` shape (and
`delta.function_call` when streamed), on test_tool_calls.py's scripted servers."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from test_tool_calls import MODEL, SCRIPTS, TOOLS, client, servers

__all__ = ["servers"]  # the fixture, shared with test_tool_calls.py

FUNCTIONS: list[Any] = [tool["function"] for tool in TOOLS]


def ask(url: str, trigger: str, *, stream: bool, **kwargs: Any) -> dict[str, Any]:
    """The one choice's content, legacy call and finish reason; a stream is put together
    from its `delta.function_call` pieces."""
    args: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": trigger}],
                            "max_tokens": 200, "temperature": 0.0, **kwargs}
    if not stream:
        [choice] = client(url).chat.completions.create(**args).choices
        call = choice.message.function_call
        assert choice.message.tool_calls is None
        return {"content": choice.message.content,
                "function_call": None if call is None else (call.name, call.arguments),
                "finish_reason": choice.finish_reason}
    content, name, arguments, finish_reason = [], None, [], None
    for chunk in client(url).chat.completions.create(**args, stream=True):
        [streamed] = chunk.choices
        delta = streamed.delta
        assert delta.tool_calls is None
        content.append(delta.content or "")
        if delta.function_call is not None:
            assert name is None or delta.function_call.name is None  # the name comes once
            name = name or delta.function_call.name
            arguments.append(delta.function_call.arguments or "")
        finish_reason = streamed.finish_reason or finish_reason
    return {"content": "".join(content) or None,
            "function_call": None if name is None else (name, "".join(arguments)),
            "finish_reason": finish_reason}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_functions_answer_with_one_function_call(servers: dict[str, str],
                                                 stream: bool) -> None:
    """An "auto" choice: the legacy shape holds one call, so the model's second is dropped."""
    out = ask(servers["parsed"], "parallel calls", stream=stream, functions=FUNCTIONS)
    assert out["function_call"] is not None
    name, arguments = out["function_call"]
    assert (name, json.loads(arguments)) == ("get_weather", {"city": "Paris"})
    assert out["content"] is None and out["finish_reason"] == "function_call"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_function_call_by_name_is_forced(servers: dict[str, str], stream: bool) -> None:
    """A named function_call forces its arguments through the grammar, as a named
    tool_choice does (and finishes with "stop", as that does)."""
    out = ask(servers["plain"], "forced named", stream=stream, functions=FUNCTIONS,
              function_call={"name": "get_weather"})
    assert out == {"content": None,
                   "function_call": ("get_weather", SCRIPTS["forced named"]),
                   "finish_reason": "stop"}


def test_function_call_none_and_legacy_messages(servers: dict[str, str]) -> None:
    """function_call "none" leaves the output text; a conversation in the legacy shape (an
    assistant `function_call`, a role "function" result) is rendered, so the model reads the
    result (the script answers only once it does)."""
    out = ask(servers["parsed"], "parallel calls", stream=False, functions=FUNCTIONS,
              function_call="none")
    assert out == {"content": SCRIPTS["parallel calls"], "function_call": None,
                   "finish_reason": "stop"}
    messages: list[Any] = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None,
         "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"role": "function", "name": "get_weather", "content": "legacy result"}]
    reply = client(servers["parsed"]).chat.completions.create(
        model=MODEL, messages=messages, functions=FUNCTIONS, temperature=0.0)
    assert reply.choices[0].message.content == SCRIPTS["legacy result"]
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(("body", "param"), [
    ({"functions": FUNCTIONS, "tools": TOOLS}, "functions"),
    ({"tools": TOOLS, "function_call": "auto", "tool_choice": "auto"}, "function_call"),
    ({"functions": [{"name": "two words"}]}, "functions[0]"),
    ({"functions": FUNCTIONS, "function_call": "get_weather"}, "function_call"),
    ({"functions": FUNCTIONS, "function_call": {"name": "nope"}}, "function_call"),
], ids=["functions-and-tools", "both-choices", "bad-function", "bad-choice", "unknown-name"])
def test_legacy_field_errors(servers: dict[str, str], body: dict[str, Any],
                             param: str) -> None:
    response = httpx.post(f"{servers['parsed']}/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "x"}], **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param.split("[")[0]
    assert param in error["message"]


def test_openai_client_raises_bad_request(servers: dict[str, str]) -> None:
    with pytest.raises(openai.BadRequestError, match="deprecated form of tools"):
        client(servers["parsed"]).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], functions=FUNCTIONS,
            tools=TOOLS)
