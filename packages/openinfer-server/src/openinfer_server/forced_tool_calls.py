"""The output of a forced tool choice, turned into calls. A grammar (structured.py) makes the
model write, for tool_choice "required", a JSON array of `{"name": ..., "parameters": {...}}`
(vLLM's convention) and, for a named function, that function's arguments object. Both classes
implement `openinfer_core.interfaces.parsers.ToolParser`."""

from __future__ import annotations

import json
from enum import Enum

from openinfer_core.interfaces.parsers import ToolCallDelta, ToolParse
from openinfer_core.text.tool_parsers.calls import arguments_json, new_call_id


class NamedToolCallParser:
    """The whole output is the arguments of one call to `name`, streamed as it comes: the
    first delta carries the call's id and name, every piece of text is an arguments fragment
    (verbatim, so a length-truncated output gives truncated arguments, as OpenAI does)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._started = False

    def feed(self, text: str) -> ToolParse:
        return ToolParse(calls=(self._delta(text),)) if text else ToolParse()

    def finish(self) -> ToolParse:
        return ToolParse() if self._started else ToolParse(calls=(self._delta(""),))

    def _delta(self, text: str) -> ToolCallDelta:
        if self._started:
            return ToolCallDelta(0, arguments=text)
        self._started = True
        return ToolCallDelta(0, new_call_id(), self._name, text)


class _State(Enum):
    START = "start"  # before the array's "["
    ARRAY = "array"  # inside it
    DONE = "done"  # after its "]"
    CONTENT = "content"  # the output left the expected shape: the rest is content


class RequiredToolCallsParser:
    """The output is a JSON array of `{"name": str, "parameters": {...}}`; each element
    becomes a call (sent whole) as soon as it closes. The array's brackets, commas and
    whitespace are framing. From the first thing that does not fit (text before the array, an
    element that is not such an object, text after the array, an element cut off at the end)
    the output is content, verbatim."""

    def __init__(self) -> None:
        self._state = _State.START
        self._lead = ""  # whitespace before "[": content if no array follows
        self._element: list[str] = []  # the open element's text
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._calls = 0

    def feed(self, text: str) -> ToolParse:
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        for i, ch in enumerate(text):
            if self._state is _State.CONTENT:
                content.append(text[i:])
                break
            self._step(ch, content, calls)
        return ToolParse("".join(content), tuple(calls))

    def finish(self) -> ToolParse:
        text = self._lead if self._state is _State.START else "".join(self._element)
        self._state, self._lead, self._element = _State.CONTENT, "", []
        return ToolParse(text)

    def _step(self, ch: str, content: list[str], calls: list[ToolCallDelta]) -> None:
        state = self._state
        if state is _State.START:
            if ch.isspace():
                self._lead += ch
            elif ch == "[":
                self._state = _State.ARRAY
            else:
                self._leave(self._lead + ch, content)
        elif state is _State.DONE:
            if not ch.isspace():
                self._leave(ch, content)
        elif not self._element:  # between elements
            if ch == "]":
                self._state = _State.DONE
            elif ch == "{":
                self._element, self._depth = [ch], 1
            elif not (ch.isspace() or ch == ","):
                self._leave(ch, content)
        else:
            self._element.append(ch)
            self._track(ch)
            if self._depth == 0:
                text = "".join(self._element)
                self._element = []
                call = self._call(text)
                if call is None:
                    self._leave(text, content)
                else:
                    calls.append(call)

    def _track(self, ch: str) -> None:
        """Nesting depth, outside JSON strings."""
        if self._in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._in_string = False
        elif ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1

    def _leave(self, text: str, content: list[str]) -> None:
        self._state = _State.CONTENT
        content.append(text)

    def _call(self, text: str) -> ToolCallDelta | None:
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        params = obj.get("parameters", obj.get("arguments", {}))
        if not isinstance(params, dict):
            return None
        index, self._calls = self._calls, self._calls + 1
        return ToolCallDelta(index, new_call_id(), obj["name"], arguments_json(params))
