"""Every client mistake gets a 4xx in OpenAI's error shape, naming what was wrong."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from live_server import API_KEY, MODEL, LiveServer, error_of


def post(server: LiveServer, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=30, **kwargs)


COMPLETION = {"model": MODEL, "prompt": "Hello", "max_tokens": 4}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("temperature", -0.5, "[0, 100]"),
    ("top_p", 0.0, "(0, 1]"),
    ("top_k", -7, ">= 1"),
    ("min_p", 1.5, "[0, 1]"),
    ("presence_penalty", 3.0, "[-2, 2]"),
    ("frequency_penalty", -3.0, "[-2, 2]"),
    ("repetition_penalty", 0.0, "(0, 2]"),
    ("max_tokens", 0, ">= 1"),
    ("min_tokens", 9, "max_tokens=4"),
    ("logprobs", 21, "[0, 20]"),
    ("seed", 2**70, "64-bit"),
    ("stop", [""], "non-empty"),
    ("n", 0, "greater than or equal to 1"),
    ("n", 100000, "less than or equal to"),
    ("stop_token_ids", [-1], "non-negative"),
    ("logit_bias", {"1": 5}, "not supported"),
    ("stream_options", {"include_usage": True}, "stream=true"),
    ("suffix", "tail", "not supported"),
])
def test_invalid_completion_parameter_is_named(server: LiveServer, field: str, value: Any,
                                               needle: str) -> None:
    err = error_of(post(server, "/v1/completions", {**COMPLETION, field: value}), 400)
    assert err["param"] == field and err["type"] == "invalid_request_error"
    assert needle in err["message"]


@pytest.mark.parametrize(("body", "param"), [
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 25}, "top_logprobs"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": "f"}}, "tool_choice"),
    ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs"),
    ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
])
def test_invalid_chat_parameter_is_named(server: LiveServer, body: dict[str, Any],
                                         param: str) -> None:
    err = error_of(post(server, "/v1/chat/completions", {**CHAT, **body}), 400)
    assert err["param"] == param


def test_openai_client_sees_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", temperature=7000)
    assert "temperature" in str(info.value)


def test_too_long_names_the_numbers(server: LiveServer) -> None:
    err = error_of(post(server, "/v1/completions", {**COMPLETION, "prompt": [1] * 500,
                                                    "max_tokens": 20}), 400)
    assert "maximum context length is 512 tokens" in err["message"]
    assert "520 tokens (500 in the prompt, 20 in the completion)" in err["message"]
    assert err["code"] == "context_length_exceeded"
    err = error_of(post(server, "/v1/chat/completions",
                        {**CHAT, "max_completion_tokens": 600}), 400)
    assert "in the messages, 600 in the completion" in err["message"]
    assert err["param"] == "max_completion_tokens"
    # no max_tokens, but no room left either
    err = error_of(post(server, "/v1/completions", {"prompt": [1] * 512}), 400)
    assert "512 in the prompt" in err["message"]


def test_app_max_model_len_applies(keyed_server: LiveServer) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    err = error_of(post(keyed_server, "/v1/completions", {**COMPLETION, "max_tokens": 200},
                        headers=headers), 400)
    assert "maximum context length is 128 tokens" in err["message"]


def test_unknown_model_is_404(server: LiveServer, client: openai.OpenAI) -> None:
    err = error_of(post(server, "/v1/completions", {**COMPLETION, "model": "gpt-9"}), 404)
    assert "gpt-9" in err["message"] and err["code"] == "model_not_found"
    error_of(post(server, "/v1/chat/completions", {**CHAT, "model": "gpt-9"}), 404)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_api_key(keyed_server: LiveServer) -> None:
    url = keyed_server.url
    err = error_of(httpx.post(f"{url}/v1/completions", json=COMPLETION), 401)
    assert "missing" in err["message"]
    err = error_of(httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
    assert "incorrect" in err["message"]
    good = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    assert good.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices
    bad = openai.OpenAI(base_url=f"{url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(f"{url}/health").status_code == 200  # every route: test_api_key.py


@pytest.mark.parametrize("raw", [b"{", b"not json", b"[1, 2", b'{"prompt": "x",}', b"",
                                 b"\xff\xfe"])
def test_malformed_json_is_400(server: LiveServer, raw: bytes) -> None:
    for path in ("/v1/completions", "/v1/chat/completions"):
        r = httpx.post(f"{server.url}{path}", content=raw,
                       headers={"Content-Type": "application/json"})
        error_of(r, 400)


@pytest.mark.parametrize("body", [
    [], 42, "text", None, {"prompt": {"a": 1}}, {"prompt": []}, {"prompt": [[]]},
    {"prompt": ""}, {"prompt": [1.5, 2]}, {"prompt": [True]}, {"prompt": "x", "n": "many"},
    {"prompt": "x", "stop": 5}, {"prompt": "x", "max_tokens": 1.5},
])
def test_schema_violations_are_400(server: LiveServer, body: Any) -> None:
    error_of(post(server, "/v1/completions", body), 400)


@pytest.mark.parametrize("prompt", [[151936], [10**12], [-1], [[1, 2], [999999]]])
def test_token_ids_outside_vocabulary(server: LiveServer, prompt: Any) -> None:
    err = error_of(post(server, "/v1/completions", {**COMPLETION, "prompt": prompt}), 400)
    assert err["param"] == "prompt"


def test_unknown_route_and_method_keep_the_shape(server: LiveServer) -> None:
    error_of(httpx.get(f"{server.url}/v1/nothing-here"), 404)
    error_of(httpx.get(f"{server.url}/v1/completions"), 405)


def test_wrong_content_type_is_400(server: LiveServer) -> None:
    r = httpx.post(f"{server.url}/v1/completions", content=b"prompt=hi",
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    error_of(r, 400)
