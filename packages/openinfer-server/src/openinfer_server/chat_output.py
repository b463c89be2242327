"""A chat choice's output text, split into reasoning, content and tool calls, and written in
OpenAI's message and chunk-delta shapes.

The server holds `ChatParsers` (what `--tool-call-parser` / `--reasoning-parser` chose); each
request makes a `ChatParsing` from its `tools` and `tool_choice`; each choice of the response
runs a `ChoiceOutput`: the reasoning parser first, then the tool parser on the content.

With `parallel_tool_calls: false` a choice keeps its first call only (vLLM's rule): later
calls are dropped, text is kept. (Where a call ends relative to the text around it is not
known to the parsers' output, so cutting the text there would depend on the chunking.) A
request that used the deprecated `functions` field is answered as OpenAI answered it: one
call, as `function_call` (not `tool_calls`), with finish reason "function_call"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from openinfer_core.errors import InvalidParameterError
from openinfer_core.interfaces.parsers import (
    ReasoningParser,
    ReasoningParserFactory,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    ToolParserFactory,
)
from openinfer_core.registry import Registries
from openinfer_core.text.tool_parsers.calls import whole_calls
from openinfer_server.forced_tool_calls import NamedToolCallParser, RequiredToolCallsParser

ToolModeKind = Literal["none", "auto", "required", "named"]
# How calls are written: `tool_calls` (a list), or the legacy single `function_call`.
CallFormat = Literal["tool_calls", "function_call"]


@dataclass(frozen=True, slots=True)
class ToolMode:
    """What a request's `tool_choice` asks of the output: `none` (plain text), `auto` (the
    model may call; the tool parser finds the calls), `required` / `named` (a grammar forces
    the calls; `name` is the function of a named choice)."""

    kind: ToolModeKind = "none"
    name: str | None = None

    @classmethod
    def of(cls, tools: Sequence[Any] | None, tool_choice: str | Mapping[str, Any] | None
           ) -> ToolMode:
        """OpenAI's rules: no tools or "none" is `none`; an omitted choice is `auto`."""
        if not tools or tool_choice == "none":
            return cls("none")
        if tool_choice is None or tool_choice == "auto":
            return cls("auto")
        if tool_choice == "required":
            return cls("required")
        if isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
            function = tool_choice.get("function")
            name = function.get("name") if isinstance(function, Mapping) else None
            if isinstance(name, str):
                return cls("named", name)
        raise InvalidParameterError(
            "tool_choice", 'must be "none", "auto", "required" or {"type": "function", '
            f'"function": {{"name": ...}}}}, got {tool_choice!r}')


@dataclass(slots=True)
class OutputPiece:
    """What some of a choice's text turned out to be."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def extend(self, other: OutputPiece) -> None:
        self.reasoning += other.reasoning
        self.content += other.content
        self.calls.extend(other.calls)

    def delta(self, call_format: CallFormat = "tool_calls") -> dict[str, Any]:
        """The fields of a `chat.completion.chunk` delta (empty when there is nothing). In
        the `function_call` format the calls are one call's pieces (index 0)."""
        out: dict[str, Any] = {}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.content:
            out["content"] = self.content
        if self.calls and call_format == "function_call":
            out["function_call"] = _legacy_delta(self.calls)
        elif self.calls:
            out["tool_calls"] = [_wire_delta(d) for d in self.calls]
        return out


class ChoiceOutput:
    """One choice's parsers, fed its text deltas in order, then finished once. Not
    thread-safe. `made_calls` tells whether any tool call came out so far. With
    `single_call`, calls after the first are dropped."""

    def __init__(self, reasoning: ReasoningParser | None, tools: ToolParser | None, *,
                 single_call: bool = False) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self._single_call = single_call
        self.made_calls = False

    def feed(self, text: str) -> OutputPiece:
        if self._reasoning is None:
            return self._tool_part("", text)
        parsed = self._reasoning.feed(text)
        return self._tool_part(parsed.reasoning, parsed.content)

    def finish(self) -> OutputPiece:
        piece = OutputPiece()
        if self._reasoning is not None:
            parsed = self._reasoning.finish()
            piece = self._tool_part(parsed.reasoning, parsed.content)
        if self._tools is not None:
            tail = self._tools.finish()
            piece.extend(self._bounded(OutputPiece(content=tail.content,
                                                   calls=list(tail.calls))))
        return piece

    def _tool_part(self, reasoning: str, content: str) -> OutputPiece:
        if self._tools is None or not content:
            return OutputPiece(reasoning, content)
        parsed = self._tools.feed(content)
        return self._bounded(OutputPiece(reasoning, parsed.content, list(parsed.calls)))

    def _bounded(self, piece: OutputPiece) -> OutputPiece:
        """`piece` as passed on: with `single_call`, without the calls after the first."""
        if self._single_call:
            piece.calls = [d for d in piece.calls if d.index == 0]
        self.made_calls = self.made_calls or bool(piece.calls)
        return piece


@dataclass(frozen=True, slots=True)
class ChatParsing:
    """The parsing one chat request's output gets. `active` is False for a plain request
    (no tools in play, no reasoning parser): its text is sent as it comes."""

    tool_mode: ToolMode = ToolMode()
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_parser: ToolParserFactory | None = None
    reasoning_parser: ReasoningParserFactory | None = None
    prompt: str | None = None  # the rendered prompt, which may open a reasoning block
    parallel_tool_calls: bool = True  # False: one call at most
    call_format: CallFormat = "tool_calls"

    @property
    def active(self) -> bool:
        return self.reasoning_parser is not None or self.tool_mode.kind != "none"

    def choice(self) -> ChoiceOutput:
        """A fresh output state for one choice."""
        reasoning = None
        if self.reasoning_parser is not None:
            reasoning = self.reasoning_parser(prompt=self.prompt)
        tools: ToolParser | None = None
        kind = self.tool_mode.kind
        if kind == "auto" and self.tool_parser is not None:
            tools = self.tool_parser(tools=self.tools)
        elif kind == "required":
            tools = RequiredToolCallsParser()
        elif kind == "named":
            assert self.tool_mode.name is not None
            tools = NamedToolCallParser(self.tool_mode.name)
        single = not self.parallel_tool_calls or self.call_format == "function_call"
        return ChoiceOutput(reasoning, tools, single_call=single)

    def finish_reason(self, reason: str, made_calls: bool) -> str:
        """OpenAI's and vLLM's: "tool_calls" (or "function_call", in that format) when the
        model stopped after calling a tool, but "stop" for a named tool choice; "length"
        stays."""
        if reason == "stop" and made_calls and self.tool_mode.kind in ("auto", "required"):
            return "function_call" if self.call_format == "function_call" else "tool_calls"
        return reason

    def delta(self, piece: OutputPiece) -> dict[str, Any]:
        """`piece` as a chunk's delta fields, calls in this request's format."""
        return piece.delta(self.call_format)

    def message(self, text: str) -> tuple[dict[str, Any], bool]:
        """A whole choice's `message` fields and whether it called a tool."""
        output = self.choice()
        piece = output.feed(text)
        piece.extend(output.finish())
        calls = whole_calls(piece.calls)
        message: dict[str, Any] = {"role": "assistant", "content": piece.content or None,
                                   "refusal": None}
        if self.reasoning_parser is not None:
            message["reasoning_content"] = piece.reasoning or None
        if calls and self.call_format == "function_call":
            message["function_call"] = {"name": calls[0].name, "arguments": calls[0].arguments}
        elif calls:
            message["tool_calls"] = [_wire_call(c) for c in calls]
        return message, output.made_calls


@dataclass(frozen=True, slots=True)
class ChatParsers:
    """The server's parsers (None: off), and the installed tool-parser names for messages."""

    tool: ToolParserFactory | None = None
    reasoning: ReasoningParserFactory | None = None
    installed_tool_parsers: tuple[str, ...] = ()

    @classmethod
    def from_names(cls, registries: Registries, tool: str | None,
                   reasoning: str | None) -> ChatParsers:
        """Resolve registered names (None: off); raises PluginError for an unknown one."""
        return cls(registries.tool_parsers.resolve(tool) if tool else None,
                   registries.reasoning_parsers.resolve(reasoning) if reasoning else None,
                   tuple(registries.tool_parsers.names()))

    def for_request(self, tools: Sequence[Mapping[str, Any]] | None,
                    tool_choice: str | Mapping[str, Any] | None,
                    prompt: str | None, *, parallel_tool_calls: bool = True,
                    call_format: CallFormat = "tool_calls") -> ChatParsing:
        """The parsing a request gets; a 400 (InvalidParameterError) for tools with an "auto"
        choice when the server has no tool-call parser, as vLLM."""
        mode = ToolMode.of(tools, tool_choice)
        if mode.kind == "auto" and self.tool is None:
            names = ", ".join(self.installed_tool_parsers) or "none installed"
            raise InvalidParameterError(
                "tool_choice", '"auto" tool choice needs a tool-call parser, and this server '
                "has none: start it with --enable-auto-tool-choice --tool-call-parser NAME "
                f'(installed: {names}), or send tool_choice "none", "required" or a named '
                "function")
        return ChatParsing(mode, tuple(tools or ()), self.tool, self.reasoning, prompt,
                           parallel_tool_calls, call_format)


def _wire_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _wire_delta(delta: ToolCallDelta) -> dict[str, Any]:
    if delta.id is None:
        return {"index": delta.index, "function": {"arguments": delta.arguments}}
    return {"index": delta.index, "id": delta.id, "type": "function",
            "function": {"name": delta.name, "arguments": delta.arguments}}


def _legacy_delta(deltas: Sequence[ToolCallDelta]) -> dict[str, Any]:
    """One chunk's pieces of the single call, as a legacy `delta.function_call`: the name
    with the first piece, then arguments fragments."""
    out: dict[str, Any] = {}
    name = next((d.name for d in deltas if d.name is not None), None)
    if name is not None:
        out["name"] = name
    out["arguments"] = "".join(d.arguments for d in deltas)
    return out
