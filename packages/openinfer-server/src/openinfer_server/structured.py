"""From a request's structured-output fields to the engine's `StructuredOutput`: OpenAI's
`response_format`, vLLM's `structured_outputs` and `guided_*`, and forced tool choice. Each
grammar is checked here (it compiles within llguidance's limits, within CHECK_TIMEOUT_S, and
admits some string), so a bad one is a 400 naming the request field it came from before the
engine sees it."""

from __future__ import annotations

import asyncio
import functools
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from openinfer_core.errors import InvalidParameterError
from openinfer_core.params import STRUCTURED_KINDS, StructuredOutput
from openinfer_core.structured.grammar import check
from openinfer_server.protocol import ChatCompletionRequest, _Sampling

# A check costs up to milliseconds for a large tool set (tens for a grammar near
# llguidance's limits), which clients send again and again; a failed check raises, and
# raising is not cached. Checks run on threads of their own (llguidance drops the GIL while
# it builds a grammar), so the event loop goes on serving; one that takes longer than
# CHECK_TIMEOUT_S (a schema of a thousand alternatives takes seconds) is refused rather than
# waited for, and its thread finishes in the background.
CHECK_TIMEOUT_S = 2.0
_cached_check = functools.lru_cache(maxsize=256)(check)
_checks = ThreadPoolExecutor(2, thread_name_prefix="openinfer-grammar-check")


async def _check(spec: StructuredOutput, field: str) -> None:
    """`check`, its error naming the request field (`field`) that carried the grammar."""
    try:
        await asyncio.wait_for(asyncio.wrap_future(_checks.submit(_cached_check, spec)),
                               CHECK_TIMEOUT_S)
    except TimeoutError as exc:
        raise InvalidParameterError(
            field, f"the {spec.kind} grammar could not be checked within "
            f"{CHECK_TIMEOUT_S:g} s: it is too large (or the server is busy checking others)"
        ) from exc
    except InvalidParameterError as exc:
        reason = str(exc).removeprefix(f"{exc.param}: ")
        raise InvalidParameterError(field, f"the {exc.param} {reason}") from exc


async def structured_output(body: _Sampling) -> StructuredOutput | None:
    """The one structured-output constraint the request asks for, checked; None if none."""
    found = _requested(body)
    if found is None:
        return None
    field, spec = found
    await _check(spec, field)
    return spec


def _requested(body: _Sampling) -> tuple[str, StructuredOutput] | None:
    """(the field, the constraint) the request asks for, unchecked; None if none."""
    found: list[tuple[str, StructuredOutput]] = []
    if body.response_format is not None:
        spec = _from_response_format(body.response_format)
        if spec is not None:
            found.append(("response_format", spec))
    if body.structured_outputs is not None:
        found.append(("structured_outputs", _from_structured_outputs(body.structured_outputs)))
    guided = {"json": body.guided_json, "regex": body.guided_regex,
              "choice": body.guided_choice, "grammar": body.guided_grammar}
    for kind, value in guided.items():
        if value is not None:
            found.append((f"guided_{kind}", _spec(kind, value, f"guided_{kind}")))
    if len(found) > 1:
        raise InvalidParameterError(
            found[1][0], f"only one structured-output field may be given, got "
            f"{', '.join(name for name, _ in found)}")
    return found[0] if found else None


async def chat_structured_output(body: ChatCompletionRequest) -> StructuredOutput | None:
    """`structured_output`, or the grammar that forces a tool call: tool_choice "required"
    makes the text a JSON array of {"name", "parameters"} (one or more calls; exactly one
    with parallel_tool_calls false), a named function makes it that function's arguments
    object."""
    forced = _forced_tool_schema(body)
    if forced is None:
        return await structured_output(body)
    if _requested(body) is not None:
        raise InvalidParameterError(
            "tool_choice", "a forced tool choice cannot be combined with response_format or "
            "structured_outputs")
    spec = StructuredOutput("json", json.dumps(forced))
    await _check(spec, "tools" if body.functions is None else "functions")
    return spec


def _forced_tool_schema(body: ChatCompletionRequest) -> dict[str, Any] | None:
    choice = body.tool_choice
    if choice in (None, "none", "auto"):
        return None
    functions = _functions(body.tools)
    if choice == "required":
        if not functions:
            raise InvalidParameterError("tool_choice", "'required' needs a non-empty tools list")
        calls = [{"type": "object", "properties": {
            "name": {"type": "string", "enum": [name]}, "parameters": params},
            "required": ["name", "parameters"], "additionalProperties": False}
            for name, params in functions.items()]
        items = calls[0] if len(calls) == 1 else {"anyOf": calls}
        bound = {"maxItems": 1} if body.parallel_tool_calls is False else {}
        return {"type": "array", "minItems": 1, **bound, "items": items}
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise InvalidParameterError(
                "tool_choice", 'must be "none", "auto", "required" or {"type": "function", '
                '"function": {"name": ...}}')
        if name not in functions:
            legacy = body.functions is not None  # the request's own field names
            raise InvalidParameterError(
                "function_call" if legacy else "tool_choice", f"names function {name!r}, "
                f"which is not in {'functions' if legacy else 'tools'} "
                f"({', '.join(map(repr, functions)) or 'none given'})")
        return functions[name]
    raise InvalidParameterError(
        "tool_choice", f'must be "none", "auto", "required" or a named function, got {choice!r}')


def _functions(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Function name -> its parameters schema (an empty object when it takes none). The
    tools are well formed (validation.check_tools ran as the body was parsed)."""
    return {tool["function"]["name"]: tool["function"].get("parameters")
            or {"type": "object", "properties": {}} for tool in tools or []}


def _from_response_format(fmt: dict[str, Any]) -> StructuredOutput | None:
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind == "json_schema":
        inner = fmt.get("json_schema")
        if not isinstance(inner, dict):
            raise InvalidParameterError(
                "response_format", 'json_schema needs {"json_schema": {"name": ..., '
                '"schema": {...}}}')
        schema = inner.get("schema")
        if schema is None:  # OpenAI lets the schema out: any JSON object then
            return StructuredOutput("json_object")
        if not isinstance(schema, dict):
            raise InvalidParameterError(
                "response_format", 'json_schema needs {"json_schema": {"name": ..., '
                '"schema": {...}}}')
        return StructuredOutput("json", json.dumps(schema))
    raise InvalidParameterError(
        "response_format", f"type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


def _from_structured_outputs(fields: dict[str, Any]) -> StructuredOutput:
    given = [(k, v) for k, v in fields.items() if k in STRUCTURED_KINDS and v not in (None, False)]
    if len(given) != 1:
        raise InvalidParameterError(
            "structured_outputs", f"must set exactly one of {', '.join(STRUCTURED_KINDS)}, got "
            f"{', '.join(k for k, _ in given) or 'none'}")
    kind, value = given[0]
    return _spec(kind, value, "structured_outputs")


def _spec(kind: str, value: Any, param: str) -> StructuredOutput:
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind == "json":
        if isinstance(value, str):
            return StructuredOutput("json", value)
        if isinstance(value, dict):
            return StructuredOutput("json", json.dumps(value))
    elif kind == "choice":
        if isinstance(value, list) and value and all(isinstance(c, str) for c in value):
            return StructuredOutput("choice", json.dumps(value))
    elif isinstance(value, str):
        return StructuredOutput(kind, value)
    raise InvalidParameterError(param, f"{kind} has the wrong type: {type(value).__name__}")
