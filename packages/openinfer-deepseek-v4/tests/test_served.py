"""`openinfer serve --demo deepseek-v4` as a user runs it: the line's demo checkpoint (written on
first use into the cache), served with the OpenAI API. Chat prompts are DeepSeek-V4's own
encoding (what /tokenize returns equals `encode_messages`), completions stream, tool requests
go through the DSML parser, and greedy output is the same for the same prompt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from openinfer_core.testing import served_demo
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_deepseek_v4.chat.encoding import encode_messages

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("served")
    with served_demo("deepseek-v4", root) as url:
        [folder] = (root / "cache").glob("demo-deepseek-v4-*")
        yield url, folder


def test_models_lists_the_demo(served: tuple[str, Path]) -> None:
    url, _ = served
    models = openai.OpenAI(base_url=f"{url}/v1", api_key="x").models.list().data
    assert [m.id for m in models] == ["openinfer-demo"]


def test_chat_prompt_is_the_v4_encoding(served: tuple[str, Path]) -> None:
    url, folder = served
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi there"}]
    body = {"model": "openinfer-demo", "messages": messages}
    got = httpx.post(f"{url}/tokenize", json=body, timeout=30).json()["tokens"]
    tok = Tokenizer.from_dir(folder)
    want = tok.encode(encode_messages(messages, thinking=False), add_special_tokens=False)
    assert got == want
    assert got[0] == 0 and tok.decode(got[-1:]) == "</think>"  # BOS ... chat mode's close


def test_chat_and_streamed_completion(served: tuple[str, Path]) -> None:
    url, _ = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    ask = dict(model="openinfer-demo", messages=[{"role": "user", "content": "Hello"}],
               max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    first = client.chat.completions.create(**ask)  # type: ignore[call-overload]
    again = client.chat.completions.create(**ask)  # type: ignore[call-overload]
    assert first.choices[0].finish_reason == "length"
    assert first.usage.completion_tokens == 12
    assert first.choices[0].message.content == again.choices[0].message.content
    stream = client.completions.create(model="openinfer-demo", prompt="The sea", max_tokens=10,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    pieces = [c.choices[0].text for c in stream if c.choices]
    whole = client.completions.create(model="openinfer-demo", prompt="The sea", max_tokens=10,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert "".join(pieces) == whole.choices[0].text


def test_tools_render_and_parse(served: tuple[str, Path]) -> None:
    """Random weights will not call a tool; the request with tools must be encoded with them
    (the prompt grows by the tool block) and answered without error."""
    url, _ = served
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    plain = httpx.post(f"{url}/tokenize", json={"model": "openinfer-demo",
                                                 "messages": messages}, timeout=30).json()
    with_tools = httpx.post(f"{url}/tokenize", json={"model": "openinfer-demo",
                                                      "messages": messages, "tools": tools},
                            timeout=30).json()
    assert with_tools["count"] > plain["count"] + 20
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    reply = client.chat.completions.create(model="openinfer-demo", messages=messages,  # type: ignore[arg-type]
                                           tools=tools, max_tokens=8)  # type: ignore[arg-type]
    assert reply.choices[0].finish_reason in ("length", "stop", "tool_calls")
