"""Many clients at once get exactly what each would get alone (greedy)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
from live_server import MODEL, LiveServer

NUM_REQUESTS = 40


def _request(i: int) -> dict:
    """Varied prompt lengths, output lengths and kinds, so batches mix prefill and decode."""
    return {"prompt": f"Request {i}: " + "lorem ipsum " * (i % 7), "max_tokens": 4 + i % 9,
            "stream": i % 3 == 0, "chat": i % 4 == 1}


async def _run(client: openai.AsyncOpenAI, spec: dict) -> tuple[str, int]:
    extra: dict[str, Any] = {"ignore_eos": True}
    if spec["chat"]:
        messages: Any = [{"role": "user", "content": spec["prompt"]}]
        extra["chat_template_kwargs"] = {"enable_thinking": False}
        if spec["stream"]:
            text, tokens = "", 0
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=spec["max_tokens"], temperature=0,
                stream=True, stream_options={"include_usage": True}, extra_body=extra)
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                if chunk.usage:
                    tokens = chunk.usage.completion_tokens
            return text, tokens
        out = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=spec["max_tokens"], temperature=0,
            extra_body=extra)
        assert out.usage is not None
        return out.choices[0].message.content or "", out.usage.completion_tokens
    if spec["stream"]:
        text, tokens = "", 0
        completions = await client.completions.create(
            model=MODEL, prompt=spec["prompt"], max_tokens=spec["max_tokens"], temperature=0,
            stream=True, stream_options={"include_usage": True}, extra_body=extra)
        async for piece in completions:
            if piece.choices:
                text += piece.choices[0].text
            if piece.usage:
                tokens = piece.usage.completion_tokens
        return text, tokens
    done = await client.completions.create(
        model=MODEL, prompt=spec["prompt"], max_tokens=spec["max_tokens"], temperature=0,
        extra_body=extra)
    assert done.usage is not None
    return done.choices[0].text, done.usage.completion_tokens


def test_concurrent_equals_alone(server: LiveServer) -> None:
    specs = [_request(i) for i in range(NUM_REQUESTS)]

    async def alone() -> list[tuple[str, int]]:
        client = server.async_client()
        return [await _run(client, s) for s in specs]

    async def together() -> list[tuple[str, int]]:
        client = server.async_client()
        return list(await asyncio.gather(*(_run(client, s) for s in specs)))

    expected = asyncio.run(alone())
    assert [tokens for _, tokens in expected] == [s["max_tokens"] for s in specs]
    assert asyncio.run(together()) == expected
    server.wait_idle()
