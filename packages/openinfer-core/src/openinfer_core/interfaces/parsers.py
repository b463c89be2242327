"""Text-level parsers a frontend applies to a model's output: tool calls and reasoning.

Both kinds are built once per response choice and fed the choice's text as it is decoded, in
deltas of any size. They are stateful, single-threaded and never raise on odd model output:
text that does not fit their format comes back as content. Chunking never changes the result:
for any split of a text into deltas, concatenating what `feed` returned for each, and then
what `finish` returned, gives exactly what one `feed(text)` followed by `finish()` gives.
Registered as `"module:Class"` through `openinfer_register_tool_parsers` /
`openinfer_register_reasoning_parsers`; the class itself is the factory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One whole function call, as in OpenAI's `message.tool_calls[i]`."""

    id: str
    name: str
    arguments: str  # the JSON text of the arguments object (OpenAI's wire format is a string)


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of the `index`-th call of a choice (0, 1, ... in order of appearance). A call's
    first delta carries its `id` and `name`; its `arguments` fragments concatenate, in order,
    to the call's arguments JSON."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class ToolParse:
    """What a tool parser made of some text: plain content and tool-call deltas."""

    content: str = ""
    calls: tuple[ToolCallDelta, ...] = ()


@dataclass(frozen=True, slots=True)
class ReasoningParse:
    """What a reasoning parser made of some text: reasoning and the content after it."""

    reasoning: str = ""
    content: str = ""


class ToolParser(Protocol):
    """Turns one choice's output text into content and tool calls. Mutates its own state only;
    not thread-safe. May hold text back (a possible start of a call's markup) until a later
    `feed` or `finish` decides it."""

    def feed(self, text: str) -> ToolParse:
        """Consume the next `text` of the output; return what is now decided."""
        ...

    def finish(self) -> ToolParse:
        """The output has ended: return everything still held back. Call once, last."""
        ...


class ToolParserFactory(Protocol):
    """A registered tool parser class: `cls(tools=request_tools)` per choice, where `tools` is
    the request's OpenAI `tools` list (for parsers whose format needs the schemas)."""

    def __call__(self, *, tools: Sequence[Mapping[str, Any]]) -> ToolParser: ...


class ReasoningParser(Protocol):
    """Splits one choice's output into reasoning and content. Mutates its own state only; not
    thread-safe. May hold text back (a possible start of a reasoning tag) until a later `feed`
    or `finish` decides it."""

    def feed(self, text: str) -> ReasoningParse:
        """Consume the next `text` of the output; return what is now decided."""
        ...

    def finish(self) -> ReasoningParse:
        """The output has ended: return everything still held back. Call once, last."""
        ...


class ReasoningParserFactory(Protocol):
    """A registered reasoning parser class: `cls(prompt=text)` per choice. `prompt` is the
    rendered prompt the output continues (chat templates open or close a reasoning block in
    it), or None when unknown; the parser then decides from the output alone."""

    def __call__(self, *, prompt: str | None) -> ReasoningParser: ...
