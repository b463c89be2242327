"""A chat choice's output through the request's parsers: tool modes, the forced-tool-choice
parsers, finish reasons, and streamed deltas that add up to the non-streamed message."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from openinfer_core.errors import InvalidParameterError
from openinfer_core.interfaces.parsers import ToolCallDelta, ToolParser
from openinfer_core.plugins import PluginManager
from openinfer_core.text.tool_parsers.calls import whole_calls
from openinfer_server.chat_output import ChatParsers, ChatParsing, OutputPiece, ToolMode
from openinfer_server.forced_tool_calls import NamedToolCallParser, RequiredToolCallsParser

TOOLS = [{"type": "function", "function": {"name": "f"}}]
REGS = PluginManager(autoload=True).registries
QWEN3 = ChatParsers.from_names(REGS, "hermes", "qwen3")
PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def chunkings(text: str, seed: int = 0) -> list[list[str]]:
    """One character at a time, every split in two, and random splits."""
    out = [list(text), [text]] + [[text[:i], text[i:]] for i in range(1, len(text))]
    rng = random.Random(seed)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 6))))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


@pytest.mark.parametrize("tools, choice, expected", [
    (None, None, ToolMode("none")),
    ([], "auto", ToolMode("none")),
    (TOOLS, "none", ToolMode("none")),
    (TOOLS, None, ToolMode("auto")),
    (TOOLS, "auto", ToolMode("auto")),
    (TOOLS, "required", ToolMode("required")),
    (TOOLS, {"type": "function", "function": {"name": "f"}}, ToolMode("named", "f")),
])
def test_tool_mode(tools: Any, choice: Any, expected: ToolMode) -> None:
    assert ToolMode.of(tools, choice) == expected


def test_tool_mode_refuses_an_odd_choice() -> None:
    with pytest.raises(InvalidParameterError, match="tool_choice"):
        ToolMode.of(TOOLS, "sometimes")


def test_auto_without_a_parser_names_the_flags() -> None:
    bare = ChatParsers.from_names(REGS, None, None)
    with pytest.raises(InvalidParameterError, match="--tool-call-parser NAME .installed: ") as e:
        bare.for_request(TOOLS, "auto", PROMPT)
    assert "hermes" in str(e.value) and "deepseek_v4" in str(e.value)
    assert not bare.for_request(TOOLS, "none", PROMPT).active
    assert bare.for_request(TOOLS, "required", PROMPT).active  # forced: no parser needed


def forced(parser: ToolParser, pieces: list[str]) -> tuple[str, list[tuple[str, str]]]:
    content, deltas = [], []
    for piece in [*pieces, None]:
        out = parser.finish() if piece is None else parser.feed(piece)
        content.append(out.content)
        deltas.extend(out.calls)
    return "".join(content), [(c.name, c.arguments) for c in whole_calls(deltas)]


REQUIRED = [
    ('[{"name": "f", "parameters": {"a": "x]}"}}, {"name":"g","parameters":{}}]',
     ("", [("f", '{"a": "x]}"}'), ("g", "{}")])),
    ('  [ {"name": "天", "parameters": {"s": "\\"}{"}} ]  ', ("", [("天", '{"s": "\\"}{"}')])),
    ('[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "para',  # cut off by length
     ('{"name": "g", "para', [("f", '{"a": 1}')])),
    ('not an array', ("not an array", [])),
    ('[{"name": 3, "parameters": {}}, {"name": "g", "parameters": {}}]',
     ('{"name": 3, "parameters": {}}, {"name": "g", "parameters": {}}]', [])),
    ('[1]', ("1]", [])),
    ('[{"name": "f", "parameters": {}}] trailing', ("trailing", [("f", "{}")])),
    ("", ("", [])),
]


@pytest.mark.parametrize("text, expected", REQUIRED)
def test_required_tool_calls(text: str, expected: Any) -> None:
    for pieces in chunkings(text) if text else [[]]:
        assert forced(RequiredToolCallsParser(), pieces) == expected, pieces


def test_named_tool_call_streams_the_arguments_as_they_come() -> None:
    parser = NamedToolCallParser("f")
    first, second = parser.feed('{"a": '), parser.feed("1}")
    assert first.calls[0].id is not None and first.calls[0].name == "f"
    assert second.calls == (ToolCallDelta(0, arguments="1}"),)
    assert parser.finish().calls == ()
    for pieces in chunkings('{"a": "é"}'):
        assert forced(NamedToolCallParser("f"), pieces) == ("", [("f", '{"a": "é"}')])
    assert forced(NamedToolCallParser("f"), []) == ("", [("f", "")])


@pytest.mark.parametrize("kind, reason, made_calls, expected", [
    ("auto", "stop", True, "tool_calls"),
    ("auto", "stop", False, "stop"),
    ("auto", "length", True, "length"),
    ("required", "stop", True, "tool_calls"),
    ("named", "stop", True, "stop"),  # OpenAI's and vLLM's answer for a named choice
])
def test_finish_reason(kind: Any, reason: str, made_calls: bool, expected: str) -> None:
    parsing = ChatParsing(ToolMode(kind, "f" if kind == "named" else None))
    assert parsing.finish_reason(reason, made_calls) == expected


TEXT = ("<think>\nWhich city?\n</think>\n\nChecking 2 cities.\n\n"
        + "\n".join(f'<tool_call>\n{{"name": "w", "arguments": {{"city": "{c}"}}}}\n</tool_call>'
                    for c in ("Paris", "東京")))


def test_streamed_deltas_add_up_to_the_message() -> None:
    parsing = QWEN3.for_request(TOOLS, "auto", PROMPT)
    message, made_calls = parsing.message(TEXT)
    assert made_calls and message["content"] == "Checking 2 cities."
    assert message["reasoning_content"] == "Which city?" and message["refusal"] is None
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
             for c in message["tool_calls"]]
    assert calls == [("w", {"city": "Paris"}), ("w", {"city": "東京"})]
    for pieces in chunkings(TEXT)[:200]:
        output = parsing.choice()
        total = OutputPiece()
        for piece in pieces:
            total.extend(output.feed(piece))
        total.extend(output.finish())
        assert (total.reasoning, total.content) == ("Which city?", "Checking 2 cities.")
        assert [(c.name, json.loads(c.arguments)) for c in whole_calls(total.calls)] == calls


def test_delta_fields_are_openai_chunk_fields() -> None:
    piece = OutputPiece("r", "c", [ToolCallDelta(0, "call_1", "f", "{"),
                                   ToolCallDelta(0, arguments="}")])
    assert piece.delta() == {"reasoning_content": "r", "content": "c", "tool_calls": [
        {"index": 0, "id": "call_1", "type": "function",
         "function": {"name": "f", "arguments": "{"}},
        {"index": 0, "function": {"arguments": "}"}}]}
    assert OutputPiece().delta() == {}


@pytest.mark.parametrize("call_format", ["tool_calls", "function_call"])
def test_one_call_allowed_whatever_the_chunking(call_format: Any) -> None:
    """parallel_tool_calls false (and the legacy format, which holds one call): the first
    call is kept, the second dropped, the text kept, for every split of the text."""
    parsing = QWEN3.for_request(TOOLS, "auto", PROMPT, parallel_tool_calls=False,
                                call_format=call_format)
    text = TEXT + "\nThat is all."
    message, made_calls = parsing.message(text)
    content = QWEN3.for_request(TOOLS, "auto", PROMPT).message(text)[0]["content"]
    assert made_calls and message["content"] == content and "That is all." in content
    if call_format == "function_call":
        assert "tool_calls" not in message
        assert message["function_call"]["name"] == "w"
        assert json.loads(message["function_call"]["arguments"]) == {"city": "Paris"}
    else:
        [call] = message["tool_calls"]
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert parsing.finish_reason("stop", made_calls) == call_format
    for pieces in chunkings(text)[:200]:
        output = parsing.choice()
        total = OutputPiece()
        for piece in pieces:
            total.extend(output.feed(piece))
        total.extend(output.finish())
        assert total.content == content
        assert [(c.name, json.loads(c.arguments)) for c in whole_calls(total.calls)] == [
            ("w", {"city": "Paris"})]


def test_legacy_delta_fields() -> None:
    first = OutputPiece(calls=[ToolCallDelta(0, "call_1", "f", "{")])
    rest = OutputPiece(calls=[ToolCallDelta(0, arguments="}")])
    assert first.delta("function_call") == {"function_call": {"name": "f", "arguments": "{"}}
    assert rest.delta("function_call") == {"function_call": {"arguments": "}"}}
