"""The ranges of every number a request body may carry, and the shape of its tools: checked
once, when the body is parsed, so a bad value is a 400 naming its field before anything
reaches the engine's wire (msgpack carries integers of 64 bits, no more) or its sampler.

Two layers, both here. The types below bound each integer field by what the engine can take
and each float to a finite number; pydantic applies them as it parses. `check_vocabulary`
bounds the fields whose range is the served model's vocabulary, which a type cannot know.
What a value means beyond its range (top_p in (0, 1], min_tokens <= max_tokens) stays
`SamplingParams`' to say, so the offline API and the server give the same message."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StrictInt
from pydantic_core import PydanticCustomError

from openinfer_core.errors import InvalidParameterError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1
# OpenAI's rule for a function's name.
FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def _within(lo: int, hi: int, what: str) -> AfterValidator:
    def check(value: int) -> int:
        if not lo <= value <= hi:
            raise PydanticCustomError("out_of_range", "must be {what}, got {value}",
                                      {"what": what, "value": _short(value)})
        return value
    return AfterValidator(check)


def _short(value: int) -> str:
    """A number for a message: a huge one by its sign and digit count, not its digits."""
    text = str(abs(value))
    sign = "-" if value < 0 else ""
    return f"{sign}{text}" if len(text) <= 24 else f"{sign}{text[:6]}... ({len(text)} digits)"


# Counts, lengths, priorities: anything the engine stores as a signed 64-bit integer.
Int64 = Annotated[int, _within(INT64_MIN, INT64_MAX, "a 64-bit integer")]
# The sampler reads a seed modulo 2**64, so either signedness is taken (as SamplingParams).
Seed = Annotated[int, _within(INT64_MIN, UINT64_MAX, "a 64-bit integer")]
# A token id, before `check_vocabulary` bounds it by the model's vocabulary.
TokenId = Annotated[StrictInt, _within(0, INT64_MAX, "a non-negative token id")]
# Sampling floats: JSON has no NaN or infinity, but Python's json module reads both.
Finite = Annotated[float, Field(allow_inf_nan=False)]


def check_vocabulary(vocab_size: int, *, top_k: int | None,
                     stop_token_ids: Sequence[int] | None) -> None:
    """Raise InvalidParameterError unless `top_k` is -1 or 0 (off) or at most the vocabulary,
    and every stop token id is in it."""
    if top_k is not None and top_k > vocab_size:
        raise InvalidParameterError(
            "top_k", f"must be -1 or 0 (disabled) or at most the vocabulary size "
            f"({vocab_size}), got {_short(top_k)}")
    for token in stop_token_ids or ():
        if not 0 <= token < vocab_size:
            raise InvalidParameterError(
                "stop_token_ids", f"token id {_short(token)} is outside the vocabulary "
                f"(ids 0..{vocab_size - 1})")


def check_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`tools` as OpenAI defines them (a pydantic validator: raises naming the entry).
    Each is `{"type": "function", "function": {"name", "description"?, "parameters"?,
    "strict"?}}`; `type` may be left out (vLLM's default), other keys are kept for the chat
    template. The dicts themselves are returned, unchanged."""
    for i, tool in enumerate(tools):
        problem = tool_problem(tool)
        if problem is not None:
            raise PydanticCustomError("invalid_tool", "{problem}",
                                      {"problem": problem, "param": f"tools[{i}]"})
    return tools


def tool_problem(tool: Any) -> str | None:
    """What is wrong with one `tools` entry, or None if it is well formed."""
    if not isinstance(tool, dict):
        return 'must be an object {"type": "function", "function": {...}}'
    if tool.get("type", "function") != "function":
        return f'type must be "function", got {tool.get("type")!r}'
    fn = tool.get("function")
    if not isinstance(fn, dict):
        return 'needs "function": {"name": ..., "parameters": {...}}'
    name = fn.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        return (f"function.name must be 1 to 64 letters, digits, underscores or dashes, "
                f"got {name!r}"[:200])
    for key, kind in (("description", str), ("parameters", dict), ("strict", bool)):
        value = fn.get(key)
        if value is not None and not isinstance(value, kind):
            what = "a JSON schema object" if kind is dict else f"a {kind.__name__}"
            return f"function.{key} must be {what}, got {type(value).__name__}"
    return None
