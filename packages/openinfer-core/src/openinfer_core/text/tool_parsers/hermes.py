"""The Hermes tool-call format, which Qwen2.5 and Qwen3 use:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Any number of calls (parallel calls), with content before, between and after them."""

from __future__ import annotations

import json
from typing import Any

from openinfer_core.text.tool_parsers.tagged import TaggedBlockParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesToolParser(TaggedBlockParser):
    """`interfaces.parsers.ToolParser` for the Hermes format.

    A call is `<tool_call>` + a JSON object with a string `name` and an object `arguments`
    (`parameters` is accepted too) + `</tool_call>`; the closing tag may be missing at the very
    end. A call whose JSON does not parse stays in the content, verbatim. The whitespace around
    a call is its framing and is dropped; all other text is content. Streaming: text that may
    begin `<tool_call>` is held back, and a call is sent whole (one delta with its id, name and
    arguments) once it closes."""

    OPEN, CLOSE = OPEN, CLOSE

    def _parse_block(self, body: str) -> list[tuple[str, dict[str, Any]]] | None:
        """The one call `body` describes, or None when it is not one."""
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
        return [(name, args)]
