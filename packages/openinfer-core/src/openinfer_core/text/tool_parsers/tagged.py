"""Tool calls written as tagged blocks (`OPEN` body `CLOSE`) among content: the streaming part
that Hermes (`<tool_call>`) and DeepSeek-V4's DSML (`<｜DSML｜tool_calls>`) share. A format
says how a block's body reads as calls (`_parse_block`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from openinfer_core.interfaces.parsers import ToolCallDelta, ToolParse
from openinfer_core.text.tags import undecided_tail
from openinfer_core.text.tool_parsers.calls import arguments_json, new_call_id


class TaggedBlockParser:
    """`interfaces.parsers.ToolParser` for calls in `OPEN` ... `CLOSE` blocks.

    A block whose body parses gives its calls; one that does not stays in the content,
    verbatim. The whitespace around a block is its framing and is dropped; all other text is
    content. The closing tag may be missing at the very end. Streaming: text that may begin
    `OPEN` is held back, and a block's calls are sent whole (each one delta with its id, name
    and arguments) once it closes."""

    OPEN: ClassVar[str]
    CLOSE: ClassVar[str]

    def __init__(self, *, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        self._buf = ""  # text not decided yet
        self._in_block = False  # the buffer holds a block's body
        self._space = ""  # the whitespace before the open block: content unless it parses
        self._strip = False  # a block just closed: drop the whitespace after it
        self._calls = 0

    def _parse_block(self, body: str) -> list[tuple[str, dict[str, Any]]] | None:
        """The (name, arguments) of the calls a block's body (between its tags) holds, or None
        when it is not a block of calls."""
        raise NotImplementedError

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
                end = self._buf.find(self.CLOSE)
                if end < 0 and not final:
                    break
                body = self._buf if end < 0 else self._buf[:end]
                self._buf = "" if end < 0 else self._buf[end + len(self.CLOSE):]
                self._in_block = False
                parsed = self._parse_block(body)
                if parsed is None:
                    content.append(self._space + self.OPEN + body
                                   + ("" if end < 0 else self.CLOSE))
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
            start = self._buf.find(self.OPEN)
            if start >= 0:
                before = self._buf[:start]
                kept = before.rstrip()
                content.append(kept)
                self._space = before[len(kept):]
                self._buf = self._buf[start + len(self.OPEN):]
                self._in_block = True
                continue
            cut = (len(self._buf) if final
                   else undecided_tail(self._buf, self.OPEN, with_space=True))
            content.append(self._buf[:cut])
            self._buf = self._buf[cut:]
            break
        return ToolParse("".join(content), tuple(calls))

    def _delta(self, name: str, arguments: dict[str, Any]) -> ToolCallDelta:
        index, self._calls = self._calls, self._calls + 1
        return ToolCallDelta(index, new_call_id(), name, arguments_json(arguments))
