"""validation.py and the grammar check at the API: a number the engine cannot take, a
malformed tool or a grammar no output can satisfy is a 400 naming its field, never a 500 and
never a 200 that quietly means nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from live_server import MODEL, LiveServer, error_of

from openinfer_core.errors import InvalidParameterError
from openinfer_core.ipc import EngineClient
from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest
from openinfer_server import structured

COMPLETION = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
HUGE = [2**63, 2**64, 2**70, -(2**63) - 1, -(2**64), 10**400]


def post(server: LiveServer, path: str, body: Any) -> httpx.Response:
    """`body` as JSON, NaN and Infinity included (as Python's json module writes them)."""
    return httpx.post(f"{server.url}{path}", content=json.dumps(body), timeout=30,
                      headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("field", ["top_k", "priority", "min_tokens", "max_tokens", "seed",
                                   "prompt_logprobs", "logprobs", "best_of", "n"])
def test_integers_beyond_64_bits_are_named(server: LiveServer, field: str) -> None:
    for value in HUGE:
        if field == "seed" and 0 <= value < 2**64:
            continue  # seeds take either signedness
        err = error_of(post(server, "/v1/completions", {**COMPLETION, field: value}), 400)
        assert err["param"] == field, (value, err)


@pytest.mark.parametrize("field", ["max_completion_tokens", "top_logprobs", "priority",
                                   "top_k"])
def test_chat_integers_beyond_64_bits_are_named(server: LiveServer, field: str) -> None:
    for value in HUGE:
        err = error_of(post(server, "/v1/chat/completions", {**CHAT, field: value}), 400)
        assert err["param"] == field, (value, err)


@pytest.mark.parametrize("values", [[2**64], [2**63], [10**12], [151669], [-(2**64)]])
def test_stop_token_ids_outside_the_vocabulary(server: LiveServer, values: list[int]) -> None:
    err = error_of(post(server, "/v1/completions", {**COMPLETION, "stop_token_ids": values}),
                   400)
    assert err["param"] == "stop_token_ids"


def test_top_k_is_bounded_by_the_vocabulary(server: LiveServer) -> None:
    vocab = server.tokenizer.vocab_size
    for top_k in (-1, 0, 1, vocab):
        r = post(server, "/v1/completions", {**COMPLETION, "top_k": top_k})
        assert r.status_code == 200, (top_k, r.text)
    err = error_of(post(server, "/v1/completions", {**COMPLETION, "top_k": vocab + 1}), 400)
    assert err["param"] == "top_k" and str(vocab) in err["message"]


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "presence_penalty",
                                   "frequency_penalty", "repetition_penalty"])
def test_floats_must_be_finite(server: LiveServer, field: str) -> None:
    for value in ("nan", "inf", "-Infinity", float("nan"), float("inf"), 1e400):
        err = error_of(post(server, "/v1/completions", {**COMPLETION, field: value}), 400)
        assert err["param"] == field, (value, err)


def test_the_last_seed_wraps_for_later_choices(server: LiveServer) -> None:
    """Choice i is seeded seed + i, read modulo 2**64 as the sampler reads it."""
    body = {**COMPLETION, "max_tokens": 4, "temperature": 1.0}
    top = post(server, "/v1/completions", {**body, "seed": 2**64 - 1, "n": 2})
    assert top.status_code == 200, top.text
    zero = post(server, "/v1/completions", {**body, "seed": 0})
    texts = [c["text"] for c in sorted(top.json()["choices"], key=lambda c: c["index"])]
    assert texts[1] == zero.json()["choices"][0]["text"]


@pytest.mark.parametrize(("tools", "needle"), [
    ([{"type": "nope", "function": {"name": "f"}}], 'type must be "function"'),
    ([{"type": "function"}], '"function"'),
    ([{"type": "function", "function": {}}], "function.name"),
    ([{"type": "function", "function": {"name": 5}}], "function.name"),
    ([{"type": "function", "function": {"name": "two words"}}], "function.name"),
    ([{"type": "function", "function": {"name": "x" * 65}}], "function.name"),
    ([TOOL, {"type": "function", "function": {"name": "g", "parameters": "{}"}}],
     "function.parameters"),
    ([{"type": "function", "function": {"name": "f", "description": 3}}],
     "function.description"),
    (["f"], "tools"),
])
@pytest.mark.parametrize("tool_choice", [None, "none", "auto", "required"])
def test_malformed_tools_are_refused_whatever_tool_choice(
        server: LiveServer, tools: list[Any], needle: str, tool_choice: str | None) -> None:
    body = {**CHAT, "tools": tools}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    err = error_of(post(server, "/v1/chat/completions", body), 400)
    assert err["param"] == "tools" and needle in err["message"], err


def test_tokenize_refuses_malformed_tools_too(server: LiveServer) -> None:
    body = {"messages": CHAT["messages"], "tools": [{"type": "function", "function": {}}]}
    err = error_of(post(server, "/tokenize", body), 400)
    assert err["param"] == "tools"


def test_well_formed_tools_pass(server: LiveServer) -> None:
    tools = [TOOL, {"function": {"name": "get-time_2", "description": "now", "strict": True}}]
    r = post(server, "/v1/chat/completions", {**CHAT, "tools": tools, "tool_choice": "none"})
    assert r.status_code == 200, r.text


SELF_NESTED = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}


@pytest.mark.parametrize(("body", "param", "needle"), [
    ({"guided_regex": "a{1000000}"}, "guided_regex", "too large"),
    ({"structured_outputs": {"regex": "a{1000000}"}}, "structured_outputs", "too large"),
    ({"guided_grammar": "start: start"}, "guided_grammar", "admits no string"),
    ({"structured_outputs": {"grammar": "start: start"}}, "structured_outputs",
     "admits no string"),
    ({"guided_json": SELF_NESTED}, "guided_json", "no finite JSON value"),
    ({"guided_json": {"$ref": "#"}}, "guided_json", "no finite JSON value"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": SELF_NESTED}}},
     "response_format", "no finite JSON value"),
])
def test_grammars_no_output_can_satisfy_are_refused(server: LiveServer, body: dict[str, Any],
                                                     param: str, needle: str) -> None:
    for path, base in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        err = error_of(post(server, path, {**base, **body}), 400)
        assert err["param"] == param and needle in err["message"], err


def test_a_forced_tool_whose_schema_cannot_end_is_refused(server: LiveServer) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": SELF_NESTED}}]
    body = {**CHAT, "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "f"}}}
    err = error_of(post(server, "/v1/chat/completions", body), 400)
    assert err["param"] == "tools" and "no finite JSON value" in err["message"]


def test_the_ipc_client_refuses_what_msgpack_cannot_carry(engine: EngineClient) -> None:
    """The backstop under the API's checks: an integer beyond 64 bits is the request's
    mistake, named, and leaves nothing registered."""

    async def submit(request: GenerateRequest) -> None:
        async for _ in engine.generate(request):
            pass

    cases = [(GenerateRequest("big-priority", (1,), priority=2**64), "priority"),
             (GenerateRequest("big-top-k", (1,), SamplingParams(top_k=2**64)), "top_k"),
             (GenerateRequest("big-token", (2**64,)), "prompt")]
    for request, param in cases:
        with pytest.raises(InvalidParameterError) as info:
            asyncio.run(submit(request))
        assert info.value.param == param
        assert not engine.holds(request.request_id)


def test_a_grammar_slow_to_check_is_refused_not_waited_for(
        server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """llguidance takes time cubic in the alternatives of this schema (seconds at a
    thousand); past CHECK_TIMEOUT_S the request is refused while /health stays quick."""
    monkeypatch.setattr(structured, "CHECK_TIMEOUT_S", 0.01)
    schema = {"anyOf": [{"$ref": "#"}] * 400 + [{"type": "null"}], "title": "slow"}
    err = error_of(post(server, "/v1/completions", {**COMPLETION, "guided_json": schema}), 400)
    assert err["param"] == "guided_json" and "could not be checked within" in err["message"]
    assert httpx.get(f"{server.url}/health", timeout=1).status_code == 200
