"""OpenAI's deprecated function-calling fields, which its API still accepts, mapped onto
`tools` / `tool_choice` before a chat request is validated:

- `functions: [{name, description, parameters}]` -> `tools: [{type: "function", function}]`;
- `function_call: "none" | "auto" | {name}` -> `tool_choice: "none" | "auto" |
  {type: "function", function: {name}}`;
- messages of role "function" (a function's result) -> role "tool"; an assistant message's
  `function_call` -> its `tool_calls`, so chat templates render the conversation.

Giving both `functions` and `tools` (or `function_call` and `tool_choice`) is a 400, as
OpenAI answers it. The response format for such a request is chat_output.py's
`function_call` format."""

from __future__ import annotations

from typing import Any

from pydantic_core import PydanticCustomError

from openinfer_server.validation import tool_problem

# Assistant messages' legacy calls get an id so a template can pair them with their results.
_LEGACY_CALL_ID = "call_function"


def to_tools(data: Any) -> Any:
    """The raw request body with the legacy fields mapped (a `mode="before"` validator:
    raises PydanticCustomError naming the field). Other bodies pass through unchanged."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    functions = out.get("functions")
    if functions is not None:
        _refuse_both(out, "functions", "tools")
        out["tools"] = _tools(functions)
    function_call = out.get("function_call")
    if function_call is not None:
        _refuse_both(out, "function_call", "tool_choice")
        out["tool_choice"] = _tool_choice(function_call)
    messages = out.get("messages")
    if isinstance(messages, list):
        out["messages"] = [_message(m) for m in messages]
    return out


def _refuse_both(body: dict[str, Any], legacy: str, current: str) -> None:
    if body.get(current) is not None:
        raise PydanticCustomError(
            "legacy_and_current", "{legacy} is the deprecated form of {current}; send one of "
            "them, not both", {"legacy": legacy, "current": current, "param": legacy})


def _tools(functions: Any) -> list[Any]:
    if not isinstance(functions, list):
        raise PydanticCustomError("invalid_functions", "must be a list of function objects "
                                  "{name, description, parameters}", {"param": "functions"})
    tools = [{"type": "function", "function": f} for f in functions]
    for i, tool in enumerate(tools):
        problem = tool_problem(tool)
        if problem is not None:
            raise PydanticCustomError("invalid_function", "{problem}", {
                "problem": problem.removeprefix("function."), "param": f"functions[{i}]"})
    return tools


def _tool_choice(function_call: Any) -> Any:
    if function_call in ("none", "auto"):
        return function_call
    name = function_call.get("name") if isinstance(function_call, dict) else None
    if not isinstance(name, str):
        raise PydanticCustomError(
            "invalid_function_call", 'must be "none", "auto" or {shape}, got {got}',
            {"shape": '{"name": ...}', "got": repr(function_call)[:200],
             "param": "function_call"})
    return {"type": "function", "function": {"name": name}}


def _message(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    if message.get("role") == "function":
        return {**message, "role": "tool", "tool_call_id": _LEGACY_CALL_ID}
    call = message.get("function_call")
    if message.get("role") == "assistant" and isinstance(call, dict) \
            and message.get("tool_calls") is None:
        rest = {k: v for k, v in message.items() if k != "function_call"}
        return {**rest, "tool_calls": [{"id": _LEGACY_CALL_ID, "type": "function",
                                        "function": call}]}
    return message
