"""Render a model's Jinja chat template the way HuggingFace-style templates expect."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from openinfer_core.errors import InvalidParameterError, TokenizerError


def _raise_exception(message: str) -> NoReturn:
    # Templates call this to reject conversations they cannot format (e.g. roles out of order).
    raise InvalidParameterError("messages", message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's built-in tojson escapes non-ASCII and HTML characters; templates want the
    # text as the model saw it in training.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template. Stateless after construction; safe to share between threads."""

    def __init__(self, source: str, *, bos_token: str | None, eos_token: str | None) -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TokenizerError(
                f"the chat template does not compile: {e.message} (template line {e.lineno}); "
                "fix chat_template in tokenizer_config.json or chat_template.jinja"
            ) from e

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for `messages`; extra keyword arguments reach the template as
        variables (e.g. `enable_thinking=False`)."""
        context: dict[str, Any] = {
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
            **kwargs,
            "messages": normalize_messages(messages),
            "add_generation_prompt": add_generation_prompt,
            "tools": _normalize_tools(tools),
        }
        try:
            return self._template.render(context)
        except jinja2.TemplateError as e:
            raise InvalidParameterError(
                "messages", f"the model's chat template cannot format these messages: {e}"
            ) from e


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Check the message shapes and return copies with `content` as a plain string (or None).

    Content given as OpenAI-style parts is joined into one string, parts separated by newlines;
    only text parts are accepted.
    """
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InvalidParameterError(
            "messages", f"expected a list of message objects, got {type(messages).__name__}"
        )
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidParameterError(
                "messages",
                f"messages[{i}] must be an object with 'role' and 'content', "
                f"got {type(message).__name__}",
            )
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidParameterError(
                "messages", f"messages[{i}].role must be a non-empty string, got {role!r}"
            )
        copy = dict(message)
        copy["content"] = _flatten_content(message.get("content"), i)
        out.append(copy)
    return out


def _flatten_content(content: Any, index: int) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, Sequence):
        raise InvalidParameterError(
            "messages",
            f"messages[{index}].content must be a string, null or a list of text parts, "
            f"got {type(content).__name__}",
        )
    texts: list[str] = []
    for j, part in enumerate(content):
        where = f"messages[{index}].content[{j}]"
        if not isinstance(part, Mapping):
            raise InvalidParameterError(
                "messages", f"{where} must be an object like {{'type': 'text', 'text': '...'}}"
            )
        kind = part.get("type")
        if kind != "text":
            raise InvalidParameterError(
                "messages", f"{where} has type {kind!r}; only 'text' parts are supported"
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidParameterError("messages", f"{where}.text must be a string")
        texts.append(text)
    return "\n".join(texts)


def _normalize_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if isinstance(tools, str | bytes) or not isinstance(tools, Sequence):
        raise InvalidParameterError(
            "tools", f"expected a list of tools, got {type(tools).__name__}"
        )
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise InvalidParameterError("tools", f"tools[{i}] must be an object")
    return [dict(tool) for tool in tools]
