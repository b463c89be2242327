"""The body of POST /v1/responses (OpenAI's Responses API), and its translation into a chat
completions request, so a response runs through the chat pipeline (chat.py) unchanged.

The translation: `instructions` become a leading system message; `input` items become chat
messages (a `function_call` item an assistant message's `tool_calls`, a `function_call_output`
item a `tool` message, a `reasoning` item the next assistant message's `reasoning_content`);
flat function tools `{"type": "function", "name", ...}` become chat tools; `text.format`
becomes `response_format`; `max_output_tokens` becomes `max_completion_tokens`. A mistake is
a 400 naming the Responses field, not the chat field it was translated into."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import Field, ValidationError

from openinfer_core.errors import InvalidParameterError
from openinfer_server.protocol import ChatCompletionRequest, _Body
from openinfer_server.validation import Finite, Int64, Seed

# Chat fields a translated request may be refused on, and the Responses field the client sent.
_FIELD_NAMES = {"messages": "input", "max_completion_tokens": "max_output_tokens",
                "max_tokens": "max_output_tokens", "response_format": "text",
                "reasoning_effort": "reasoning"}


class ResponsesRequest(_Body):
    """OpenAI's fields, with vLLM's sampling extras (`top_k`, `min_p`, `repetition_penalty`,
    `seed`, `priority`, `chat_template_kwargs`). Unknown fields are ignored."""

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    max_output_tokens: Int64 | None = None
    temperature: Finite | None = None
    top_p: Finite | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = True
    previous_response_id: str | None = None
    stream: bool = False
    background: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: str | None = None
    # vLLM's extras
    top_k: Int64 | None = None
    min_p: Finite | None = None
    repetition_penalty: Finite | None = None
    seed: Seed | None = None
    priority: Int64 = 0
    chat_template_kwargs: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        if self.background:
            raise InvalidParameterError("background", "background responses are not supported; "
                                        "omit it or send false")
        if self.truncation not in (None, "disabled"):
            raise InvalidParameterError("truncation", 'only "disabled" is supported')
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise InvalidParameterError(
                "max_output_tokens", f"must be >= 1, got {self.max_output_tokens}")

    def input_items(self) -> list[dict[str, Any]]:
        """`input` as a list of items (a string is one user message)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return list(self.input)

    def chat_request(self, history: list[dict[str, Any]]) -> ChatCompletionRequest:
        """The chat completions request this response runs as; `history` is the stored
        conversation of `previous_response_id` (its input and output items), which comes
        before this request's input. Raises InvalidParameterError naming the Responses field."""
        self.refuse_unsupported()
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        messages += chat_messages([*history, *self.input_items()])
        if not messages:
            raise InvalidParameterError("input", "is empty: send at least one message")
        fields: dict[str, Any] = {
            "model": self.model, "messages": messages, "stream": self.stream,
            "max_completion_tokens": self.max_output_tokens, "temperature": self.temperature,
            "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty, "seed": self.seed,
            "priority": self.priority, "chat_template_kwargs": self.chat_template_kwargs,
            "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": response_format(self.text),
        }
        if self.tools:
            fields["tools"] = chat_tools(self.tools)
            fields["tool_choice"] = chat_tool_choice(self.tool_choice)
        elif self.tool_choice not in ("auto", "none"):
            raise InvalidParameterError("tool_choice", f"{self.tool_choice!r} needs tools")
        effort = (self.reasoning or {}).get("effort")
        if effort is not None:
            fields["reasoning_effort"] = effort
        try:
            return ChatCompletionRequest.model_validate(fields)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            param = str(first.get("ctx", {}).get("param") or where or "input")
            raise InvalidParameterError(responses_field(param), first.get("msg", "invalid")
                                        ) from e


def responses_field(param: str) -> str:
    """The Responses field a chat field came from: `input` for `messages[2].content` (whose
    index counts instructions and earlier turns), `max_output_tokens` for
    `max_completion_tokens`; a field of both APIs (`tools[0]`) as it is."""
    head = param.split(".")[0].split("[")[0]
    return _FIELD_NAMES.get(head, param)


def chat_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages from Responses input (and stored output) items, in order."""
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None  # a reasoning item, waiting for its assistant message
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise InvalidParameterError(f"input[{i}]", "must be an object")
        kind = item.get("type", "message")
        if kind == "reasoning":
            reasoning = "".join(_texts(item.get("content") or item.get("summary") or [],
                                       f"input[{i}].content"))
        elif kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidParameterError(
                    f"input[{i}].role", "must be user, system, developer or assistant, "
                    f"got {role!r}")
            message: dict[str, Any] = {
                "role": "system" if role == "developer" else role,
                "content": _content(item.get("content"), f"input[{i}].content")}
            if role == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            messages.append(message)
        elif kind == "function_call":
            call = _function_call(item, i)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning is not None:
                    message["reasoning_content"], reasoning = reasoning, None
                messages.append(message)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise InvalidParameterError(f"input[{i}].call_id", "must be a string")
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": _content(item.get("output"), f"input[{i}].output")})
        else:
            raise InvalidParameterError(
                f"input[{i}].type", "must be message, function_call, function_call_output or "
                f"reasoning (openinfer serves text only), got {kind!r}")
    return messages


def _function_call(item: Mapping[str, Any], i: int) -> dict[str, Any]:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise InvalidParameterError(f"input[{i}].{key}", "must be a string")
    return {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}


def _content(content: Any, where: str) -> str:
    """A message's text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_texts(content, where))
    raise InvalidParameterError(where, "must be a string or a list of input_text parts")


def _texts(parts: list[Any], where: str) -> Iterator[str]:
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in ("input_text", "output_text", "text", "reasoning_text", "summary_text"):
            raise InvalidParameterError(
                f"{where}[{j}]", f"must be an input_text part (openinfer serves text only), "
                f"got {kind!r}")
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidParameterError(f"{where}[{j}].text", "must be a string")
        yield text


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flat Responses function tools as chat tools (checked as chat tools then)."""
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            raise InvalidParameterError(
                f"tools[{i}]", f'type must be "function" (openinfer runs no hosted tools), '
                f"got {kind!r}")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict")
                    if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: str | Mapping[str, Any]) -> str | dict[str, Any]:
    """`{"type": "function", "name": ...}` as chat's `{"type": "function", "function":
    {"name": ...}}`; the strings as they are."""
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise InvalidParameterError(
                "tool_choice", f'must be "auto", "none", "required" or {{"type": "function", '
                f'"name": ...}}, got {choice!r}')
        return choice
    name = choice.get("name")
    if choice.get("type") != "function" or not isinstance(name, str):
        raise InvalidParameterError(
            "tool_choice", 'must be "auto", "none", "required" or {"type": "function", '
            f'"name": ...}}, got {json.dumps(choice)[:200]}')
    return {"type": "function", "function": {"name": name}}


def response_format(text: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format` (None for plain text)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise InvalidParameterError("text.format.schema", "must be a JSON schema object")
        return {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "response"), "schema": schema,
            "strict": fmt.get("strict")}}
    raise InvalidParameterError(
        "text.format", f"type must be text, json_object or json_schema, got {kind!r}")
