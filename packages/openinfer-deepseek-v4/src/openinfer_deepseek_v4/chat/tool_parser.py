"""DeepSeek-V4's tool calls (DSML), which the model writes after its content:

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

A block holds one or more invokes (parallel calls). `string="true"` marks a raw string value,
`string="false"` a JSON value."""

from __future__ import annotations

import json
import re
from typing import Any

from openinfer_core.text.tool_parsers.tagged import TaggedBlockParser
from openinfer_deepseek_v4.chat.markup import (
    CALLS_CLOSE,
    CALLS_OPEN,
    INVOKE_CLOSE,
    INVOKE_OPEN,
    PARAMETER_CLOSE,
    PARAMETER_OPEN,
)

_INVOKE = re.compile(
    rf'\s*{re.escape(INVOKE_OPEN)}\s+name="([^"]+)"\s*>(.*?){re.escape(INVOKE_CLOSE)}', re.S)
_PARAMETER = re.compile(
    rf'\s*{re.escape(PARAMETER_OPEN)}\s+name="([^"]+)"(?:\s+string="(true|false)")?\s*>'
    rf"(.*?){re.escape(PARAMETER_CLOSE)}", re.S)


class DeepseekV4ToolParser(TaggedBlockParser):
    """`interfaces.parsers.ToolParser` for DSML tool calls.

    A block whose every invoke parses gives one call per invoke, its arguments the JSON object
    of its parameters in order (a `string="false"` value that is not JSON is taken as a
    string; a parameter without `string` is JSON if it parses, else a string). A block that
    does not parse (no invoke, stray text, a repeated parameter) stays in the content,
    verbatim. The whitespace around a block is its framing and is dropped; other text is
    content. A missing `</｜DSML｜tool_calls>` at the very end is forgiven. Streaming: text that
    may begin the opening tag is held back, and a block's calls are sent whole when it closes
    (each call one delta with its id, name and arguments); the block ends the reply, so this
    delays nothing."""

    OPEN, CLOSE = CALLS_OPEN, CALLS_CLOSE

    def _parse_block(self, body: str) -> list[tuple[str, dict[str, Any]]] | None:
        return parse_invokes(body)


def parse_invokes(body: str) -> list[tuple[str, dict[str, Any]]] | None:
    """The (name, arguments) of the invokes in a block's body (between its tags), or None
    when the body is anything else."""
    calls: list[tuple[str, dict[str, Any]]] = []
    pos = 0
    while (match := _INVOKE.match(body, pos)) is not None:
        arguments = _parameters(match.group(2))
        if arguments is None:
            return None
        calls.append((match.group(1), arguments))
        pos = match.end()
    if not calls or body[pos:].strip():
        return None
    return calls


def _parameters(text: str) -> dict[str, Any] | None:
    arguments: dict[str, Any] = {}
    pos = 0
    while (match := _PARAMETER.match(text, pos)) is not None:
        name, string, value = match.groups()
        if name in arguments:
            return None
        arguments[name] = value if string == "true" else _json_or_text(value)
        pos = match.end()
    return None if text[pos:].strip() else arguments


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return value
