"""`openinfer serve --demo qwen3.5` as a user runs it: the line's tiny demo checkpoint (random
weights, linear and full-attention layers, written on first use into the cache) served with
the OpenAI API. A chat completion and its streamed form agree, greedy output repeats for the
same prompt, and an image content part is refused with an OpenAI-style 400."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from openinfer_core.testing import served_demo

pytestmark = pytest.mark.slow
MODEL = "openinfer-demo"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("served")
    with served_demo("qwen3.5", root) as url:
        assert "qwen3.5" in (root / "serve.log").read_text()
        yield url


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x")


def test_models_lists_the_demo(url: str) -> None:
    assert [m.id for m in client_of(url).models.list().data] == [MODEL]


def test_chat_completion_and_its_stream(url: str) -> None:
    client = client_of(url)
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Hello there"}],
               max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    first = client.chat.completions.create(**ask)  # type: ignore[call-overload]
    again = client.chat.completions.create(**ask)  # type: ignore[call-overload]
    assert first.choices[0].finish_reason == "length"
    assert first.usage.completion_tokens == 12
    text = first.choices[0].message.content
    assert text and text == again.choices[0].message.content
    stream = client.chat.completions.create(stream=True, **ask)  # type: ignore[call-overload]
    chunks = list(stream)
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_an_image_part_is_a_400(url: str) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    with pytest.raises(openai.BadRequestError) as info:
        client_of(url).chat.completions.create(model=MODEL, messages=messages,  # type: ignore[arg-type]
                                               max_tokens=4)
    assert "image_url" in str(info.value)
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                       json={"model": MODEL, "messages": messages, "max_tokens": 4})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "messages"
    assert "only 'text' parts are supported" in error["message"]
