"""/v1/chat/completions through the official openai client against a live server."""

from __future__ import annotations

import math
from typing import Any

import openai
from live_server import MODEL

from openinfer_core.text.tokenizer import Tokenizer

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a colour."}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True}


def chat(client: openai.OpenAI, **kwargs: object) -> Any:  # a completion, or a stream
    args: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8,
                            "temperature": 0.0}
    args.update(kwargs)
    extra = {**NO_THINK, **args.pop("extra_body", {})}
    return client.chat.completions.create(**args, extra_body=extra)


def test_chat_uses_template_and_reports_usage(client: openai.OpenAI,
                                              tokenizer: Tokenizer) -> None:
    out = chat(client, max_tokens=6)
    assert out.object == "chat.completion" and out.model == MODEL
    assert out.id.startswith("chatcmpl-")
    [choice] = out.choices
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    prompt = tokenizer.apply_chat_template(MESSAGES, enable_thinking=False)
    assert prompt.endswith("<think>\n\n</think>\n\n")
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(prompt_ids), 6)
    # the same tokens through /v1/completions give the same greedy text
    same = client.completions.create(model=MODEL, prompt=prompt_ids, max_tokens=6,
                                     temperature=0, extra_body={"ignore_eos": True})
    assert choice.message.content == same.choices[0].text


def test_thinking_toggle_changes_prompt(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    thinking = chat(client, max_tokens=1, extra_body={"chat_template_kwargs": {}})
    plain = chat(client, max_tokens=1)
    assert thinking.usage is not None and plain.usage is not None
    with_think = tokenizer.apply_chat_template(MESSAGES)
    assert thinking.usage.prompt_tokens == len(tokenizer.encode(with_think,
                                                                add_special_tokens=False))
    assert plain.usage.prompt_tokens == thinking.usage.prompt_tokens + 4


def test_max_completion_tokens_and_default(client: openai.OpenAI) -> None:
    out = chat(client, max_tokens=None, max_completion_tokens=3)
    assert out.usage is not None and out.usage.completion_tokens == 3
    # no limit at all: generate until the model's length (ignore_eos) - it fills the context
    out = chat(client, max_tokens=None, messages=[{"role": "user", "content": "x" * 300}])
    assert out.usage is not None and out.usage.total_tokens == 512
    assert out.choices[0].finish_reason == "length"


def test_content_parts_and_roles(client: openai.OpenAI) -> None:
    parts = [{"role": "developer", "content": "Be brief."},
             {"role": "user", "content": [{"type": "text", "text": "Name a"},
                                          {"type": "text", "text": "colour."}]},
             {"role": "assistant", "content": "Red."},
             {"role": "user", "content": "Another?"}]
    out = chat(client, messages=parts, max_tokens=2)
    assert out.choices[0].finish_reason == "length"


def test_stream_role_first_then_content_then_usage(client: openai.OpenAI) -> None:
    whole = chat(client, max_tokens=10, n=2, seed=5, temperature=0.9)
    chunks = list(chat(client, max_tokens=10, n=2, seed=5, temperature=0.9, stream=True,
                       stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.model == MODEL for c in chunks)
    first_of: dict[int, object] = {}
    texts = {0: "", 1: ""}
    finish: dict[int, str] = {}
    for chunk in chunks[:-1]:
        [c] = chunk.choices
        first_of.setdefault(c.index, c.delta)
        texts[c.index] += c.delta.content or ""
        if c.finish_reason:
            finish[c.index] = c.finish_reason
    assert all(d.role == "assistant" for d in first_of.values())  # type: ignore[attr-defined]
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finish == {0: "length", 1: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_stream_without_usage_has_none(client: openai.OpenAI) -> None:
    chunks = list(chat(client, max_tokens=3, stream=True))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_logprobs_and_top_logprobs(client: openai.OpenAI) -> None:
    out = chat(client, max_tokens=5, logprobs=True, top_logprobs=4)
    lp = out.choices[0].logprobs
    assert lp is not None and lp.content is not None and len(lp.content) == 5
    assert "".join(t.token for t in lp.content) == out.choices[0].message.content
    for t in lp.content:
        assert len(t.top_logprobs) == 4 and t.logprob <= 0
        assert math.isclose(t.top_logprobs[0].logprob, t.logprob, abs_tol=1e-4)  # greedy
        assert t.bytes is not None
    raw = b"".join(bytes(t.bytes or []) for t in lp.content)
    assert raw.decode("utf-8", errors="replace") == out.choices[0].message.content
    streamed = chat(client, max_tokens=5, logprobs=True, top_logprobs=2, stream=True)
    entries = [e for c in streamed if c.choices and c.choices[0].logprobs
               for e in c.choices[0].logprobs.content or []]
    assert [e.token for e in entries] == [t.token for t in lp.content]
    assert chat(client, max_tokens=2).choices[0].logprobs is None


def test_stop_string_in_chat(client: openai.OpenAI) -> None:
    free = chat(client, max_tokens=16).choices[0].message.content or ""
    assert len(free) > 6
    stop = free[3:6]
    cut = chat(client, max_tokens=16, stop=stop).choices[0]
    assert cut.message.content == free[: free.index(stop)] and cut.finish_reason == "stop"


def test_seeded_n_choices_differ_and_repeat(client: openai.OpenAI) -> None:
    a = chat(client, n=3, seed=11, temperature=1.0, max_tokens=8)
    b = chat(client, n=3, seed=11, temperature=1.0, max_tokens=8)
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices] and len(set(texts)) == 3
