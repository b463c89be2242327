"""The Hermes tool-call format, which Qwen2.5 and Qwen3 use:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Any number of calls (parallel calls), with content before, between and after them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from openinfer_core.interfaces.parsers import ToolCallDelta, ToolParse
from openinfer_core.text.tags import undecided_tail
from openinfer_core.text.tool_parsers.calls import arguments_json, new_call_id

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesToolParser:
    """`interfaces.parsers.ToolParser` for the Hermes format.

    A call is `<tool_call>` + a JSON object with a string `name` and an object `arguments`
    (`parameters` is accepted too) + `</tool_call>`; the closing tag may be missing at the very
    end. A call whose JSON does not parse stays in the content, verbatim. The whitespace around
    a call is its framing and is dropped; all other text is content. Streaming: text that may
    begin `<tool_call>` is held back, and a call is sent whole (one delta with its id, name and
    arguments) once it closes."""

    def __init__(self, *, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        self._buf = ""  # text not decided yet
        self._in_call = False  # the buffer holds a call's body
        self._space = ""  # the whitespace before the open call: content unless the call parses
        self._strip = False  # a call just closed: drop the whitespace after it
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
            if self._in_call:
                end = self._buf.find(CLOSE)
                if end < 0 and not final:
                    break
                body = self._buf if end < 0 else self._buf[:end]
                self._buf = "" if end < 0 else self._buf[end + len(CLOSE):]
                self._in_call = False
                call = self._call(body)
                if call is None:
                    content.append(self._space + OPEN + body + ("" if end < 0 else CLOSE))
                else:
                    calls.append(call)
                    self._strip = True
                self._space = ""
                continue
            if self._strip:
                self._buf = self._buf.lstrip()
                if not self._buf:
                    break
                self._strip = False
            start = self._buf.find(OPEN)
            if start >= 0:
                before = self._buf[:start]
                kept = before.rstrip()
                content.append(kept)
                self._space = before[len(kept):]
                self._buf = self._buf[start + len(OPEN):]
                self._in_call = True
                continue
            cut = len(self._buf) if final else undecided_tail(self._buf, OPEN, with_space=True)
            content.append(self._buf[:cut])
            self._buf = self._buf[cut:]
            break
        return ToolParse("".join(content), tuple(calls))

    def _call(self, body: str) -> ToolCallDelta | None:
        """The call `body` describes, or None when it is not one."""
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict):
            return None
        name = obj.get("name")
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models send the arguments as JSON text
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                return None
        if not isinstance(name, str) or not name or not isinstance(args, dict):
            return None
        index, self._calls = self._calls, self._calls + 1
        return ToolCallDelta(index, new_call_id(), name, arguments_json(args))
