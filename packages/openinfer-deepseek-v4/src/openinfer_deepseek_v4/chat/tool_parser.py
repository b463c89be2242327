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
from collections.abc import Mapping, Sequence
from typing import Any

from openinfer_core.interfaces.parsers import ToolCallDelta, ToolParse
from openinfer_core.text.tags import undecided_tail
from openinfer_core.text.tool_parsers.calls import arguments_json, new_call_id
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


class DeepseekV4ToolParser:
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

    def __init__(self, *, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        self._buf = ""  # text not decided yet
        self._in_block = False  # the buffer holds a block's body
        self._space = ""  # the whitespace before the open block: content unless it parses
        self._strip = False  # a block just closed: drop the whitespace after it
        self._calls = 0

    def feed(self, text: str) -> ToolParse:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> ToolParse:
        return self._drain(final=True)

    def _drain(self, final: bool) -> ToolParse:
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        while True:
            if self._in_block:
                end = self._buf.find(CALLS_CLOSE)
                if end < 0 and not final:
                    break
                body = self._buf if end < 0 else self._buf[:end]
                self._buf = "" if end < 0 else self._buf[end + len(CALLS_CLOSE):]
                self._in_block = False
                parsed = parse_invokes(body)
                if parsed is None:
                    content.append(self._space + CALLS_OPEN + body
                                   + ("" if end < 0 else CALLS_CLOSE))
                else:
                    calls.extend(self._delta(name, args) for name, args in parsed)
                    self._strip = True
                self._space = ""
                continue
            if self._strip:
                self._buf = self._buf.lstrip()
                if not self._buf:
                    break
                self._strip = False
            start = self._buf.find(CALLS_OPEN)
            if start >= 0:
                before = self._buf[:start]
                kept = before.rstrip()
                content.append(kept)
                self._space = before[len(kept):]
                self._buf = self._buf[start + len(CALLS_OPEN):]
                self._in_block = True
                continue
            cut = len(self._buf) if final else undecided_tail(self._buf, CALLS_OPEN,
                                                              with_space=True)
            content.append(self._buf[:cut])
            self._buf = self._buf[cut:]
            break
        return ToolParse("".join(content), tuple(calls))

    def _delta(self, name: str, arguments: dict[str, Any]) -> ToolCallDelta:
        index, self._calls = self._calls, self._calls + 1
        return ToolCallDelta(index, new_call_id(), name, arguments_json(arguments))


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
