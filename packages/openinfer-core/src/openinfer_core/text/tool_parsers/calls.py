"""Tool-call ids, and whole calls assembled from their deltas."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

from openinfer_core.interfaces.parsers import ToolCall, ToolCallDelta, ToolParser


def new_call_id() -> str:
    """An OpenAI-style call id: `call_` and 24 random hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


def arguments_json(arguments: Any) -> str:
    """Arguments as OpenAI sends them: JSON text, non-ASCII kept as is."""
    return json.dumps(arguments, ensure_ascii=False)


def whole_calls(deltas: Iterable[ToolCallDelta]) -> list[ToolCall]:
    """The calls the deltas describe, by index. Raises ValueError if a call's first delta
    lacks its id or name (a parser bug)."""
    ids: dict[int, str] = {}
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for d in deltas:
        if d.index not in ids:
            if d.id is None or d.name is None:
                raise ValueError(f"the first delta of tool call {d.index} has no id or name")
            ids[d.index], names[d.index], arguments[d.index] = d.id, d.name, []
        arguments[d.index].append(d.arguments)
    return [ToolCall(ids[i], names[i], "".join(arguments[i])) for i in sorted(ids)]


def parse_all(parser: ToolParser, text: str) -> tuple[str, list[ToolCall]]:
    """A whole output through a fresh parser: its content and its calls."""
    first, last = parser.feed(text), parser.finish()
    return first.content + last.content, whole_calls(first.calls + last.calls)
