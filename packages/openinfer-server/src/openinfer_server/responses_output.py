"""A response's output items, built from its parsed text (chat_output.py's `OutputPiece`s) and
announced as OpenAI's streaming events.

Reasoning becomes a `reasoning` item (one `reasoning_text` part), content a `message` item (one
`output_text` part), each tool call a `function_call` item. A new kind of piece closes the
open item and opens the next, so a non-streamed response (its whole text fed at once) has the
same items as the streamed one."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from openinfer_server.chat_output import OutputPiece


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(slots=True)
class _Open:
    """The item being written: its kind, wire dict and text so far."""

    kind: str  # "reasoning", "message" or "function_call"
    item: dict[str, Any]
    index: int
    text: list[str] = field(default_factory=list)
    call_index: int = -1  # the parser's index of a function call


class OutputBuilder:
    """Feeds pieces in order, then `finish(status)`; each call returns the events it made
    (without `sequence_number`, which the stream adds). `items` holds the finished items.
    Mutates its own state only; not thread-safe."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._open: _Open | None = None

    def feed(self, piece: OutputPiece) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if piece.reasoning:
            events += self._text("reasoning", piece.reasoning)
        if piece.content:
            events += self._text("message", piece.content)
        for call in piece.calls:
            if call.id is not None:
                events += self._close("completed")
                events += self._open_call(call.index, call.id, call.name or "")
            if call.arguments:
                events += self._arguments(call.index, call.arguments)
        return events

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Close the open item with `status` ("completed", or "incomplete" when the output was
        cut short); a response with no output at all gets an empty message."""
        events = self._close(status)
        if not self.items:
            events += self._text("message", "")
            events += self._close(status)
        return events

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        current = self._open
        if current is None or current.kind != kind:
            events += self._close("completed")
            current = self._start(kind)
            events.append(_event("response.output_item.added", current, item=dict(current.item)))
            events.append(_event("response.content_part.added", current, content_index=0,
                                 part=_part(kind, "")))
        if text:
            current.text.append(text)
            delta = ("response.reasoning_text.delta" if kind == "reasoning"
                     else "response.output_text.delta")
            extra: dict[str, Any] = {} if kind == "reasoning" else {"logprobs": []}
            events.append(_event(delta, current, item_id=current.item["id"], content_index=0,
                                 delta=text, **extra))
        return events

    def _start(self, kind: str) -> _Open:
        item: dict[str, Any]
        if kind == "reasoning":
            item = {"id": item_id("rs"), "type": "reasoning", "summary": [], "content": [],
                    "encrypted_content": None, "status": "in_progress"}
        else:
            item = {"id": item_id("msg"), "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}
        self._open = _Open(kind, item, len(self.items))
        return self._open

    def _open_call(self, index: int, call_id: str, name: str) -> list[dict[str, Any]]:
        item = {"id": item_id("fc"), "type": "function_call", "call_id": call_id,
                "name": name, "arguments": "", "status": "in_progress"}
        self._open = _Open("function_call", item, len(self.items), call_index=index)
        return [_event("response.output_item.added", self._open, item=dict(item))]

    def _arguments(self, index: int, arguments: str) -> list[dict[str, Any]]:
        current = self._open
        if current is None or current.kind != "function_call" or current.call_index != index:
            raise AssertionError(f"arguments for tool call {index}, which is not open")
        current.text.append(arguments)
        return [_event("response.function_call_arguments.delta", current,
                       item_id=current.item["id"], delta=arguments)]

    def _close(self, status: str) -> list[dict[str, Any]]:
        current, self._open = self._open, None
        if current is None:
            return []
        text = "".join(current.text)
        item = {**current.item, "status": status}
        events: list[dict[str, Any]] = []
        if current.kind == "function_call":
            item["arguments"] = text
            events.append(_event("response.function_call_arguments.done", current,
                                 item_id=item["id"], name=item["name"], arguments=text))
        else:
            part = _part(current.kind, text)
            item["content"] = [part]
            if current.kind == "reasoning":
                events.append(_event("response.reasoning_text.done", current,
                                     item_id=item["id"], content_index=0, text=text))
            else:
                events.append(_event("response.output_text.done", current, item_id=item["id"],
                                     content_index=0, text=text, logprobs=[]))
            events.append(_event("response.content_part.done", current, item_id=item["id"],
                                 content_index=0, part=part))
        self.items.append(item)
        events.append(_event("response.output_item.done", current, item=item))
        return events


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _event(kind: str, current: _Open, **fields: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"type": kind, "output_index": current.index}
    if "item" not in fields and "item_id" not in fields:
        fields["item_id"] = current.item["id"]
    event.update(fields)
    return event


def status(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    """The response's status and `incomplete_details`: output cut by max_output_tokens (or
    the context) is incomplete."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None
