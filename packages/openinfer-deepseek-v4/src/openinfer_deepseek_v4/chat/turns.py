"""A conversation as DeepSeek-V4's encoder sees it: OpenAI-style messages checked and turned
into `Turn`s, with the format's three rewrites of the conversation:

- tool results become parts of user turns (V4 has no tool role), and a user message that
  follows user parts joins the same turn;
- the results in one user turn are ordered as the calls of the last assistant turn that
  made calls;
- in thinking mode without tools, turns before the last user turn lose their reasoning, and
  developer turns before it are left out.

Every mistake in the input is an `InvalidParameterError` naming the message."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from openinfer_core.errors import InvalidParameterError
from openinfer_deepseek_v4.chat.markup import TASK_TOKENS

ROLES = ("system", "developer", "user", "assistant", "tool", "latest_reminder")
USER_ROLES = ("user", "developer")  # the roles after which the assistant speaks


@dataclass(frozen=True, slots=True)
class ToolResult:
    call_id: str  # the tool_call_id it answers ("" when not given)
    text: str


@dataclass(frozen=True, slots=True)
class Call:
    """A call an earlier assistant turn made, its arguments as a JSON object."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(slots=True)
class Turn:
    role: str  # one of ROLES except "tool"
    text: str = ""  # the content of a system, developer, latest_reminder or assistant turn
    parts: list[str | ToolResult] = field(default_factory=list)  # a user turn's content
    tools: list[dict[str, Any]] = field(default_factory=list)  # function schemas
    response_format: Any = None
    calls: list[Call] = field(default_factory=list)
    reasoning: str = ""
    task: str | None = None  # a quick-instruction task (TASK_TOKENS)
    wo_eos: bool = False  # an assistant turn left open (no end-of-sentence)


def conversation(messages: Sequence[Mapping[str, Any]]) -> list[Turn]:
    """The turns of `messages`, tool results merged into user turns and ordered by call."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InvalidParameterError("messages", "expected a list of message objects")
    turns: list[Turn] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidParameterError("messages", f"messages[{i}] must be an object")
        role = message.get("role")
        where = f"messages[{i}]"
        if role == "tool":
            result = ToolResult(_string(message.get("tool_call_id"), f"{where}.tool_call_id"),
                                _text(message.get("content"), f"{where}.content", "\n\n"))
            if turns and turns[-1].role == "user":
                turns[-1].parts.append(result)
            else:
                turns.append(Turn("user", parts=[result]))
        elif role == "user":
            text = _text(message.get("content"), f"{where}.content", "\n")
            if turns and turns[-1].role == "user" and turns[-1].task is None:
                turns[-1].parts.append(text)
            else:
                turns.append(Turn("user", parts=[text], task=_task(message, where)))
        elif role in ROLES:
            turns.append(_turn(message, role, where))
        else:
            raise InvalidParameterError(
                "messages", f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
    _order_tool_results(turns)
    return turns


def _turn(message: Mapping[str, Any], role: str, where: str) -> Turn:
    text = _text(message.get("content"), f"{where}.content", "\n")
    if role == "developer" and not text:
        raise InvalidParameterError("messages", f"{where}: a developer message needs content")
    turn = Turn(role, text, task=_task(message, where), wo_eos=message.get("wo_eos") is True)
    if role in ("system", "developer"):
        turn.tools = tool_functions(message.get("tools"), "messages", f"{where}.tools")
        turn.response_format = message.get("response_format")
    if role == "assistant":
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        turn.reasoning = _string(reasoning, f"{where}.reasoning_content")
        turn.calls = _calls(message.get("tool_calls"), f"{where}.tool_calls")
    return turn


def tool_functions(tools: Any, param: str, where: str) -> list[dict[str, Any]]:
    """The function schemas of an OpenAI `tools` list (None: none), in order."""
    if tools is None:
        return []
    if isinstance(tools, str | bytes) or not isinstance(tools, Sequence):
        raise InvalidParameterError(param, f"{where} must be a list of tools")
    functions = []
    for j, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidParameterError(
                param, f'{where}[{j}] must look like {{"type": "function", "function": '
                '{"name": ..., "description": ..., "parameters": {...}}}')
        functions.append(dict(function))
    return functions


def _calls(calls: Any, where: str) -> list[Call]:
    if calls is None:
        return []
    if isinstance(calls, str | bytes) or not isinstance(calls, Sequence):
        raise InvalidParameterError("messages", f"{where} must be a list of tool calls")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidParameterError(
                "messages", f'{where}[{j}] must look like {{"id": ..., "type": "function", '
                '"function": {"name": ..., "arguments": "{...}"}}')
        call_id = call.get("id") or function.get("id") or ""
        out.append(Call(str(call_id), function["name"],
                        _arguments(function.get("arguments"), f"{where}[{j}]")))
    return out


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    if not isinstance(raw, str):
        raise InvalidParameterError(
            "messages", f"{where}.function.arguments must be a JSON object or its text")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return {"arguments": raw}  # what the official encoder makes of text that is not JSON
    if not isinstance(value, dict):
        raise InvalidParameterError(
            "messages", f"{where}.function.arguments must hold a JSON object, got {raw!r}")
    return value


def _order_tool_results(turns: list[Turn]) -> None:
    """Within each user turn, the tool results in the order of the calls of the last
    assistant turn that made calls (results of unknown calls first; stable otherwise)."""
    order: dict[str, int] = {}
    for turn in turns:
        if turn.role == "assistant" and turn.calls:
            order = {c.id: k for k, c in enumerate(turn.calls) if c.id}
        elif turn.role == "user" and order:
            slots = [k for k, p in enumerate(turn.parts) if isinstance(p, ToolResult)]
            if len(slots) > 1:
                results = sorted((turn.parts[k] for k in slots),
                                 key=lambda r: order.get(_call_id(r), 0))
                for k, result in zip(slots, results, strict=True):
                    turn.parts[k] = result


def _call_id(part: str | ToolResult) -> str:
    return part.call_id if isinstance(part, ToolResult) else ""


def last_user_index(turns: Sequence[Turn]) -> int:
    """The index of the last user or developer turn, -1 when there is none."""
    for i in range(len(turns) - 1, -1, -1):
        if turns[i].role in USER_ROLES:
            return i
    return -1


def drop_earlier_reasoning(turns: Sequence[Turn]) -> list[Turn]:
    """Thinking mode's history: before the last user turn, assistant turns without their
    reasoning and no developer turns."""
    last = last_user_index(turns)
    kept = []
    for i, turn in enumerate(turns):
        if i >= last or turn.role in ("user", "system", "latest_reminder"):
            kept.append(turn)
        elif turn.role == "assistant":
            kept.append(replace(turn, reasoning=""))
    return kept


def _task(message: Mapping[str, Any], where: str) -> str | None:
    task = message.get("task")
    if task is not None and task not in TASK_TOKENS:
        raise InvalidParameterError(
            "messages", f"{where}.task must be one of {', '.join(TASK_TOKENS)}, got {task!r}")
    return task


def _string(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidParameterError("messages", f"{where} must be a string")
    return value


def _text(content: Any, where: str, joiner: str) -> str:
    """Content as one string: text parts joined by `joiner`; None is empty."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, Sequence):
        raise InvalidParameterError(
            "messages", f"{where} must be a string, null or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        if not (isinstance(part, Mapping) and part.get("type") == "text"
                and isinstance(part.get("text"), str)):
            raise InvalidParameterError(
                "messages", f"{where}[{j}] must be a text part like {{'type': 'text', "
                "'text': '...'}; DeepSeek-V4 reads text only")
        texts.append(part["text"])
    return joiner.join(texts)
