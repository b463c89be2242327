"""Hostile requests, generated from a seed: every field of every POST body (read from the
request models, so a new field is fuzzed without a change here) set to extreme integers and
floats, NaN and Infinity, wrong types, deep nesting, long arrays and odd Unicode; whole bodies
that are not objects or not JSON; GETs with junk paths and query parameters.

Bodies are written as JSON text by `dump`, which passes `Raw` tokens through, so a request can
carry what no JSON encoder writes (`1e400`, a 5,000-digit integer, nesting 100,000 deep)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from openinfer_server.embeddings import EmbeddingRequest
from openinfer_server.protocol import ChatCompletionRequest, CompletionRequest
from openinfer_server.responses_protocol import ResponsesRequest
from openinfer_server.tokenization import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)

SMALL = 2  # tokens a request that reaches the engine may generate, unless fuzzed itself


class Raw(str):
    """JSON text written as is."""


@dataclass(frozen=True, slots=True)
class HostileRequest:
    method: str
    path: str
    content: bytes | None = None  # POST only

    @property
    def body(self) -> Any:
        """The body as Python reads it, for messages (None if it is not JSON)."""
        try:
            return json.loads(self.content or b"null")
        except (ValueError, RecursionError):
            return None

    @property
    def streams(self) -> bool:
        """A generation request that asks for an event stream."""
        body = self.body
        return self.path.startswith("/v1/") and isinstance(body, dict) \
            and body.get("stream") is True


INTS = [2**63, 2**63 - 1, -(2**63), -(2**63) - 1, 2**64, 2**64 - 1, -(2**64), 2**65,
        10**30, -(10**30), 2**31, 2**32, -1, 0, 1, 2]
FLOATS = [1e308, -1e308, 1.7976931348623157e308, 5e-324, -0.0, 0.5, 1.5, -2.5]
RAW = [Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e400"), Raw("-1e400"),
       Raw("1" + "0" * 5000), Raw("-" + "9" * 4400), Raw("1E-400"), Raw("0.1e999999")]
STRINGS = ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "9" * 30, "", " ", "\x00",
           "\ud800", "a\udfffb", "\u202e\u200b\ufeff", "𝕏" * 50, "null", "true", "[]",
           "{{}}", "%s%n", "../../etc/passwd", "' OR 1=1 --", "<script>", "é" * 3000]
WRONG_TYPES = [None, True, False, [], {}, [None], [[]], {"a": 1}, {"": None}, "x", [1, "a"],
               [{}], {"type": None}]


def deep(depth: int, brackets: str = "[]") -> Raw:
    return Raw(brackets[0] * depth + brackets[1] * depth)


NESTED = [deep(64), deep(500), deep(990), deep(5000), deep(100_000),
          Raw('{"a":' * 2000 + "1" + "}" * 2000)]


def deep_schema(depth: int) -> Raw:
    """An object schema nested `depth` deep, each level requiring the next."""
    return Raw('{"type":"object","properties":{"a":' * depth + '{"type":"string"}'
               + '},"required":["a"]}' * depth)


SELF_NESTED = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
SCHEMAS = [SELF_NESTED, {"$ref": "#"}, deep_schema(300),
           {"type": "integer", "minimum": 5, "maximum": 3}, {"enum": []}, {"type": "nope"},
           {"$ref": "https://example.com/s.json"}, {"anyOf": [{"$ref": "#"}] * 2000}]
GRAMMARS = ["start: start", 'start: "x" a\na: a', "start: " + " | ".join(
    f'"w{i}"' for i in range(3000)), "", "%import common.WORD"]
REGEXES = ["a{1000000}", "((a{100}){100}){100}", "(", "[^\\x00-\\x{10FFFF}]", "", "\\"]


def aimed_values(vocab_size: int) -> dict[Any, list[Any]]:
    """Values aimed at one field (a name, or a path into the body): the ends of what it
    accepts, which reach the engine, and grammars no output can satisfy."""
    last = vocab_size - 1
    return {
        "guided_json": SCHEMAS, ("structured_outputs", "json"): SCHEMAS,
        "response_format": [{"type": "json_schema", "json_schema": {"name": "x", "schema": s}}
                            for s in SCHEMAS],
        ("tools", 0, "function", "parameters"): SCHEMAS, "guided_grammar": GRAMMARS,
        "guided_regex": REGEXES, ("structured_outputs", "regex"): REGEXES,
        "tool_choice": ["required", {"type": "function", "function": {"name": "f"}}],
        "top_k": [-1, 0, 1, vocab_size], "seed": [2**64 - 1, -(2**63), 0],
        "priority": [2**63 - 1, -(2**63)], "temperature": [0, 100, 1e-9],
        "top_p": [5e-324, 1], "min_p": [0, 1], "repetition_penalty": [2, 5e-324],
        "presence_penalty": [-2, 2], "frequency_penalty": [-2, 2], "n": [1, 3],
        "min_tokens": [0, SMALL], "stop_token_ids": [[0], [last], [last] * 100],
        "logprobs": [0, 20], "top_logprobs": [0, 20], "prompt_logprobs": [0, 20],
        "stop": [["\x00"], ["a" * 1000], ["\ud7ff", "\ue000"]], "echo": [True],
        "ignore_eos": [True], "prompt": [[last], [0] * 400, "\x00"],
        "tokens": [[last], [0] * 1000], "return_tokens_as_token_ids": [True],
        "skip_special_tokens": [False], "include_stop_str_in_output": [True],
    }


def long_arrays(rng: random.Random) -> list[Any]:
    return [[0] * 10_000, [2**64] * 200, ["a"] * 5_000, [rng.randrange(200_000)] * 3_000,
            [{"role": "user", "content": "x"}] * 300, [[1, 2]] * 500, [None] * 1_000,
            "z" * 200_000]


def junk_text(rng: random.Random) -> str:
    """Random code points from every plane, surrogates and controls included."""
    return "".join(chr(rng.choice([rng.randrange(0, 0x80), rng.randrange(0xD800, 0xE000),
                                   rng.randrange(0x80, 0x110000)]))
                   for _ in range(rng.randrange(1, 40)))


def hostile_value(rng: random.Random) -> Any:
    pool = rng.choice([INTS, FLOATS, RAW, STRINGS, WRONG_TYPES, NESTED, None, None])
    if pool is None:
        return rng.choice([junk_text(rng), rng.choice(long_arrays(rng))])
    return rng.choice(pool)


def dump(value: Any) -> str:
    """JSON text of `value`; `Raw` strings go in verbatim, NaN and Infinity as Python's json
    module writes them, lone surrogates as escapes."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)


# Routes, their bases (valid bodies that reach the engine or the tokenizer), and the fields
# the models declare. Nested places where a value also travels far are fuzzed too.
MESSAGES = [{"role": "user", "content": "Hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
ROUTES: list[tuple[str, dict[str, Any], list[Any]]] = [
    ("/v1/completions", {"prompt": "Hello", "max_tokens": SMALL},
     [*CompletionRequest.model_fields, ("prompt", 0), ("stop", 0), ("stream_options",
                                                                    "include_usage")]),
    # Both length fields: the other keeps a request short when one is fuzzed to null.
    ("/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": SMALL,
                              "max_tokens": SMALL},
     [*ChatCompletionRequest.model_fields, ("messages", 0, "content"), ("messages", 0, "role"),
      ("messages", 0, "name"), ("messages", 0, "tool_calls"), ("tools", 0, "type"),
      ("tools", 0, "function"), ("tools", 0, "function", "name"),
      ("tools", 0, "function", "parameters"), ("response_format", "type"),
      ("response_format", "json_schema"), ("structured_outputs", "json"),
      ("structured_outputs", "regex"), ("chat_template_kwargs", "enable_thinking")]),
    ("/tokenize", {"prompt": "Hello"}, [*TokenizeCompletionRequest.model_fields]),
    ("/tokenize", {"messages": MESSAGES}, [*TokenizeChatRequest.model_fields,
                                           ("messages", 0, "content"), ("tools", 0)]),
    ("/detokenize", {"tokens": [1, 2, 3]}, [*DetokenizeRequest.model_fields, ("tokens", 0)]),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": SMALL},
     [*ResponsesRequest.model_fields, ("input", 0), ("text", "format"), ("tools", 0)]),
    # A generating server answers 400 here; the body is still checked first.
    ("/v1/embeddings", {"input": "Hello"}, [*EmbeddingRequest.model_fields, ("input", 0)]),
]
GET_PATHS = ["/v1/models", "/health", "/version", "/metrics", "/openapi.json", "/docs",
             "/redoc", "/tokenizer_info", "/v1/responses/resp_x"]
# Shares of the requests: POST bodies per route, whole-body junk, GETs.
WEIGHTS = {"/v1/completions": 8, "/v1/chat/completions": 9, "/tokenize": 4,
           "/detokenize": 2, "/v1/responses": 4, "/v1/embeddings": 1, "body": 2, "get": 3}


# Every field of every body meets each of these alone (`sweep`).
EXTREMES = [2**63, 2**63 - 1, -(2**63) - 1, 2**64, -(2**64), 10**30, 1e308, Raw("NaN"),
            Raw("Infinity"), Raw("-Infinity"), Raw("1e400"), Raw("1" + "0" * 5000), "nan",
            "-inf"]


def requests(seed: int, vocab_size: int, *, extra: int) -> list[HostileRequest]:
    """`sweep()`, then `extra` random requests; the same `seed` gives the same ones."""
    return [*sweep(), *random_requests(extra, seed, vocab_size)]


def sweep() -> Iterator[HostileRequest]:
    """Each field of each route set to each of `EXTREMES`, the rest of the body valid: a
    value that slips past the checks reaches the engine."""
    for path, base, fields in ROUTES:
        for field in fields:
            for value in EXTREMES:
                body = _place(json.loads(json.dumps(base)),
                              field if isinstance(field, tuple) else (field,), value)
                yield HostileRequest("POST", path, dump(body).encode())


def random_requests(count: int, seed: int, vocab_size: int) -> Iterator[HostileRequest]:
    """`count` requests with one to three fields fuzzed at once (one, mostly). A fuzzed
    field takes a value aimed at it (see `aimed_values`) half the time, so that many reach
    the engine."""
    rng = random.Random(seed)
    aimed = aimed_values(vocab_size)
    kinds = list(WEIGHTS)
    for _ in range(count):
        kind = rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
        if kind == "get":
            yield _get(rng)
        elif kind == "body":
            yield _junk_body(rng)
        else:
            path, base, fields = rng.choice([r for r in ROUTES if r[0] == kind])
            yield HostileRequest("POST", path, dump(_mutate(rng, base, fields, aimed)).encode(
                "utf-8", "surrogatepass"))


def _mutate(rng: random.Random, base: dict[str, Any], fields: list[Any],
            aimed: dict[Any, list[Any]]) -> dict[str, Any]:
    body = json.loads(json.dumps(base))
    if "messages" in body and rng.random() < 0.3:
        body["tools"] = TOOLS
    for field in rng.sample(fields, rng.choice([1, 1, 1, 2, 3])):
        pool = aimed.get(field)
        value = rng.choice(pool) if pool and rng.random() < 0.5 else hostile_value(rng)
        body = _place(body, field if isinstance(field, tuple) else (field,), value)
    if rng.random() < 0.25:
        body["stream"] = True
    return body


def _place(node: Any, where: tuple[Any, ...], value: Any) -> Any:
    """`node` with node[where[0]][where[1]]... set to `value`, building what is missing or of
    another shape on the way."""
    if not where:
        return value
    key, rest = where[0], where[1:]
    if isinstance(key, int):
        node = node if isinstance(node, list) and node else [{}]
        key %= len(node)
    elif not isinstance(node, dict):
        node = {}
    node[key] = _place(node[key] if isinstance(key, int) else node.get(key), rest, value)
    return node


def _junk_body(rng: random.Random) -> HostileRequest:
    path = rng.choice([r[0] for r in ROUTES])
    content = rng.choice([
        b"", b"{", b"}", b"[", b"null", b"0", b'"x"', b"\xff\xfe\x00", b"{" * 10_000,
        dump(hostile_value(rng)).encode("utf-8", "surrogatepass"),
        b'{"prompt": "x", "prompt": 5}', b'{"messages": [' + b'{"a": 1},' * 5000 + b"1]}",
        junk_text(rng).encode("utf-8", "surrogatepass"), b"\x00" * 100,
    ])
    return HostileRequest("POST", path, content)


def _get(rng: random.Random) -> HostileRequest:
    path = rng.choice([*GET_PATHS, "/v1/models/" + junk_text(rng).encode(
        "utf-8", "surrogatepass").hex(), "/v1/models/%00%ff", "/v1/models/" + "a/" * 500,
                       "/v1/models/..%2F..%2Fetc"])
    params = "&".join(f"{rng.choice(['x', 'limit', 'model', '', '%ff'])}="
                      f"{rng.choice(['', str(2**64), 'nan', '%00', '%ff%fe', 'a' * 2000])}"
                      for _ in range(rng.randint(0, 4)))
    return HostileRequest(rng.choice(["GET", "GET", "GET", "HEAD"]),
                          f"{path}?{params}" if params else path)
