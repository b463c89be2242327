"""Structured output through the official openai client: every output of a random-weight model
parses and validates against the schema it was given, streamed or not; the other forms
(json_object, regex, choice, grammar; vLLM's `structured_outputs` and `guided_*`) hold too."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

import jsonschema
import openai
import pydantic
from live_server import MODEL

from openinfer_server.bench.schemas import schemas

SCHEMAS = 200
MAX_TOKENS = 256  # a bounded schema ends well before this (under 100 tokens seen)


def chat(client: openai.OpenAI, *, stream: bool = False, **kwargs: Any) -> tuple[str, str]:
    """(content, finish_reason), streamed or not."""
    args: dict[str, Any] = {"model": MODEL, "max_tokens": MAX_TOKENS, "messages": [
        {"role": "user", "content": "Reply in JSON."}], **kwargs}
    if not stream:
        out = client.chat.completions.create(**args)
        return out.choices[0].message.content or "", out.choices[0].finish_reason
    parts: list[str] = []
    finish = ""
    for chunk in client.chat.completions.create(**args, stream=True):
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(parts), finish


def test_generated_schemas_always_validate(client: openai.OpenAI) -> None:
    """200 schemas, half streamed, half sampled at temperature 1 (half greedy), at once."""
    work = schemas(SCHEMAS, seed=5)

    def one(i: int) -> tuple[int, str, str]:
        text, finish = chat(
            client, stream=i % 2 == 1, temperature=1.0 if i % 4 >= 2 else 0.0, seed=i,
            response_format={"type": "json_schema",
                             "json_schema": {"name": f"s{i}", "schema": work[i]}})
        return i, text, finish

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(SCHEMAS)))
    for i, text, finish in results:
        assert finish == "stop", (i, finish, text)
        jsonschema.validate(json.loads(text), work[i])


Tag = Annotated[str, pydantic.StringConstraints(max_length=8)]


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)
    tags: list[Tag] = pydantic.Field(max_length=3)


def test_openai_parse_helper(client: openai.OpenAI) -> None:
    """`client.chat.completions.parse` sends a strict json_schema and parses the reply."""
    out = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Who?"}], response_format=Person,
        max_tokens=MAX_TOKENS, temperature=0.0)
    person = out.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120


def test_json_object(client: openai.OpenAI) -> None:
    """Any object is allowed, so a random model often runs to max_tokens inside one; seeded
    choices that end parse as objects, and each seed streams exactly what it returns whole."""
    ended = []
    for seed in range(8):
        args: dict[str, Any] = {"temperature": 1.0, "seed": seed, "max_tokens": 200,
                                "response_format": {"type": "json_object"}}
        text, finish = chat(client, **args)
        assert chat(client, stream=True, **args) == (text, finish)
        assert text.startswith("{")
        if finish == "stop":
            ended.append(json.loads(text))
    assert ended and all(isinstance(x, dict) for x in ended)


def test_vllm_fields_regex_choice_grammar(client: openai.OpenAI) -> None:
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"structured_outputs": {"regex": "[a-c]{3}-[0-9]{2}"}},
         lambda t: re.fullmatch("[a-c]{3}-[0-9]{2}", t)),
        ({"guided_regex": "(yes|no)!"}, lambda t: t in ("yes!", "no!")),
        ({"structured_outputs": {"choice": ["alpha", "beta", "gamma"]}},
         lambda t: t in ("alpha", "beta", "gamma")),
        ({"guided_choice": ["left", "right"]}, lambda t: t in ("left", "right")),
        ({"structured_outputs": {"grammar": 'start: "x" ("+" "x")*  ";"'}},
         lambda t: re.fullmatch(r"x(\+x)*;", t)),
        ({"guided_json": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                          "required": ["ok"], "additionalProperties": False}},
         lambda t: isinstance(json.loads(t)["ok"], bool)),
    ]
    for extra, valid in cases:
        for seed in range(3):
            text, finish = chat(client, temperature=1.0, seed=seed, extra_body=extra)
            assert finish == "stop" and valid(text), (extra, text)


def test_completions_endpoint_takes_them_too(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=MODEL, prompt="Colour:", max_tokens=16, temperature=1.0, seed=3,
        extra_body={"structured_outputs": {"choice": ["red", "green"]}})
    assert out.choices[0].text in ("red", "green")


def test_a_slow_compile_does_not_hold_back_others(client: openai.OpenAI) -> None:
    """Plain requests sent while many distinct grammars compile all finish."""
    work = schemas(24, seed=9)
    with ThreadPoolExecutor(32) as pool:
        constrained = [pool.submit(chat, client, temperature=0.0, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": s}}) for s in work]
        plain = [pool.submit(chat, client, temperature=0.0, max_tokens=4) for _ in range(8)]
        assert all(f.result()[1] == "length" for f in plain)
        for f, s in zip(constrained, work, strict=True):
            jsonschema.validate(json.loads(f.result()[0]), s)
