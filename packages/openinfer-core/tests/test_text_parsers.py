"""The text-level output parsers: Hermes tool calls and <think> reasoning. Whole outputs,
prompts that open or close a reasoning block, and the same result for every chunking."""

from __future__ import annotations

import json
import random

import pytest

from openinfer_core.interfaces.parsers import ReasoningParser, ToolCallDelta, ToolParser
from openinfer_core.text.reasoning.think import DeepSeekR1ReasoningParser, Qwen3ReasoningParser
from openinfer_core.text.tags import undecided_tail
from openinfer_core.text.tool_parsers.calls import parse_all, whole_calls
from openinfer_core.text.tool_parsers.hermes import HermesToolParser

Parsed = tuple[str, list[tuple[str, str]]]  # content, (name, arguments) per call


def whole(text: str) -> Parsed:
    content, calls = parse_all(HermesToolParser(tools=[]), text)
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in calls)
    return content, [(c.name, c.arguments) for c in calls]


def streamed(pieces: list[str]) -> Parsed:
    parser: ToolParser = HermesToolParser(tools=[])
    content: list[str] = []
    deltas: list[ToolCallDelta] = []
    for piece in [*pieces, None]:
        out = parser.finish() if piece is None else parser.feed(piece)
        content.append(out.content)
        deltas.extend(out.calls)
    return "".join(content), [(c.name, c.arguments) for c in whole_calls(deltas)]


def chunkings(text: str, seed: int = 0) -> list[list[str]]:
    """One character at a time, every split in two, and random splits."""
    out = [list(text), [text]]
    out += [[text[:i], text[i:]] for i in range(1, len(text))]
    rng = random.Random(seed)
    for _ in range(100):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8))))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


def call(name: str, **arguments: object) -> str:
    return ("<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) +
            "\n</tool_call>")


CASES: list[tuple[str, Parsed]] = [
    ("plain answer, no calls", ("plain answer, no calls", [])),
    (call("get_weather", city="Paris"), ("", [("get_weather", '{"city": "Paris"}')])),
    ("Let me check.\n\n" + call("a", x=1) + "\n" + call("b") + "\n",
     ("Let me check.", [("a", '{"x": 1}'), ("b", "{}")])),
    (call("a", x=1) + "\nThat is all.", ("That is all.", [("a", '{"x": 1}')])),
    ("before " + call("a") + " between " + call("b") + " after",
     ("beforebetweenafter", [("a", "{}"), ("b", "{}")])),
    # unicode, kept unescaped in the arguments
    ("天气: " + call("天气", 城市="北京", emoji="🎉"),
     ("天气:", [("天气", '{"城市": "北京", "emoji": "🎉"}')])),
    # malformed JSON, a non-object, no name: content, verbatim, and parsing goes on after
    ("x <tool_call>\n{not json}\n</tool_call> y " + call("ok"),
     ("x <tool_call>\n{not json}\n</tool_call> y", [("ok", "{}")])),
    ("<tool_call>[1, 2]</tool_call>", ("<tool_call>[1, 2]</tool_call>", [])),
    ('<tool_call>{"arguments": {}}</tool_call>', ('<tool_call>{"arguments": {}}</tool_call>', [])),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
     ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', [])),
    # `parameters` and arguments as JSON text are accepted
    ('<tool_call>{"name": "f", "parameters": {"a": [1, {"b": null}]}}</tool_call>',
     ("", [("f", '{"a": [1, {"b": null}]}')])),
    ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 2}"}</tool_call>',
     ("", [("f", '{"a": 2}')])),
    # the closing tag missing at the very end: still a call if the JSON is whole
    ('<tool_call>\n{"name": "f", "arguments": {}}\n', ("", [("f", "{}")])),
    ('ok <tool_call>\n{"name": "f", "argu', ('ok <tool_call>\n{"name": "f", "argu', [])),
    ("<tool_call>", ("<tool_call>", [])),
    # things that only look like a tag stay content
    ("a < b and <tool_> and <tool_call", ("a < b and <tool_> and <tool_call", [])),
    ("trailing space  \n", ("trailing space  \n", [])),
    ("</tool_call> stray close", ("</tool_call> stray close", [])),
]


@pytest.mark.parametrize("text, expected", CASES)
def test_hermes_whole_output(text: str, expected: Parsed) -> None:
    assert whole(text) == expected


@pytest.mark.parametrize("text", [text for text, _ in CASES])
def test_hermes_every_chunking_gives_the_whole_result(text: str) -> None:
    expected = whole(text)
    for pieces in chunkings(text):
        assert streamed(pieces) == expected, pieces


def test_hermes_never_leaks_a_partial_tag_into_content() -> None:
    text = "Checking." + call("a", q="x")
    parser = HermesToolParser(tools=[])
    sent = ""
    for ch in text:
        sent += parser.feed(ch).content
        assert "<" not in sent, sent
    assert sent + parser.finish().content == "Checking."


def test_hermes_call_deltas_are_openai_shaped() -> None:
    parser = HermesToolParser(tools=[])
    first = parser.feed(call("a", x=1) + call("b", y=2))
    assert [(d.index, d.name, d.arguments) for d in first.calls] == [
        (0, "a", '{"x": 1}'), (1, "b", '{"y": 2}')]
    ids = [d.id for d in first.calls]
    assert all(i is not None and i.startswith("call_") for i in ids) and ids[0] != ids[1]
    assert parser.finish().calls == ()


def test_hermes_deep_nesting_is_content_not_a_crash() -> None:
    body = "[" * 100_000 + "]" * 100_000
    text = f"<tool_call>{body}</tool_call>"
    assert whole(text) == (text, [])


def test_undecided_tail() -> None:
    assert undecided_tail("abc <tool", "<tool_call>") == 4
    assert undecided_tail("abc <tool", "<tool_call>", with_space=True) == 3
    assert undecided_tail("abc", "<tool_call>") == 3
    assert undecided_tail("abc<", "<tool_call>") == 3
    assert undecided_tail("", "<x>") == 0


# -- reasoning ------------------------------------------------------------------------------
THINKING_ON = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
THINKING_OFF = THINKING_ON + "<think>\n\n</think>\n\n"
OPENED = THINKING_ON + "<think>\n"

Split = tuple[str, str]  # reasoning, content


def run(cls: type[Qwen3ReasoningParser], prompt: str | None, pieces: list[str]) -> Split:
    parser: ReasoningParser = cls(prompt=prompt)
    reasoning: list[str] = []
    content: list[str] = []
    for piece in [*pieces, None]:
        out = parser.finish() if piece is None else parser.feed(piece)
        reasoning.append(out.reasoning)
        content.append(out.content)
    return "".join(reasoning), "".join(content)


QWEN3: list[tuple[str | None, str, Split]] = [
    (THINKING_ON, "<think>\nLet me see.\n</think>\n\nIt is 4.", ("Let me see.", "It is 4.")),
    (THINKING_ON, "<think>\n\n</think>\n\nNo thoughts.", ("", "No thoughts.")),
    (THINKING_ON, "<think>\nstill thinking when cut off  ", ("still thinking when cut off  ", "")),
    (THINKING_ON, "No think block at all.", ("", "No think block at all.")),
    (THINKING_ON, "a </think> is not reasoning here", ("", "a </think> is not reasoning here")),
    (THINKING_ON, "  <think>x</think>y", ("x", "y")),
    (THINKING_OFF, "Plain answer.", ("", "Plain answer.")),
    (THINKING_OFF, "<think>ignored</think>", ("", "<think>ignored</think>")),
    (OPENED, "Reasoning only.\n</think>\n\nAnswer: 思考 🎉",
     ("Reasoning only.", "Answer: 思考 🎉")),
    (OPENED, "never closed", ("never closed", "")),
    # the prompt unknown: the output alone decides
    (None, "<think>r</think>c", ("r", "c")),
    (None, "opened in the prompt\n</think>\n\nanswer", ("opened in the prompt", "answer")),
    (None, "no tags", ("", "no tags")),
    (None, "", ("", "")),
    (THINKING_ON, "", ("", "")),
    (THINKING_ON, "<thi", ("", "<thi")),
    (THINKING_ON, "<think>a </thin", ("a </thin", "")),
    (THINKING_ON, "<think>a</think>b</think>c", ("a", "b</think>c")),
]

DEEPSEEK: list[tuple[str | None, str, Split]] = [
    (THINKING_ON, "r1 skips the tag</think>answer", ("r1 skips the tag", "answer")),
    (THINKING_ON, "never closed", ("never closed", "")),
    (THINKING_ON, "<think>\nr\n</think>\n\nc", ("r", "c")),
    (THINKING_OFF, "answer", ("", "answer")),
    (None, "all reasoning", ("all reasoning", "")),
]


@pytest.mark.parametrize("prompt, text, expected", QWEN3)
def test_qwen3(prompt: str | None, text: str, expected: Split) -> None:
    assert run(Qwen3ReasoningParser, prompt, [text]) == expected


@pytest.mark.parametrize("prompt, text, expected", DEEPSEEK)
def test_deepseek_r1(prompt: str | None, text: str, expected: Split) -> None:
    assert run(DeepSeekR1ReasoningParser, prompt, [text]) == expected


@pytest.mark.parametrize("cls, prompt, text", [
    *((Qwen3ReasoningParser, p, t) for p, t, _ in QWEN3 if len(t) > 1),
    *((DeepSeekR1ReasoningParser, p, t) for p, t, _ in DEEPSEEK),
])
def test_every_chunking_gives_the_whole_result(cls: type[Qwen3ReasoningParser],
                                               prompt: str | None, text: str) -> None:
    expected = run(cls, prompt, [text])
    for pieces in chunkings(text):
        assert run(cls, prompt, pieces) == expected, pieces


def test_streaming_sends_reasoning_before_the_end_and_never_a_partial_tag() -> None:
    parser = Qwen3ReasoningParser(prompt=THINKING_ON)
    sent = [parser.feed(ch) for ch in "<think>\nabc def</think>\n\nxyz"]
    reasoning = "".join(p.reasoning for p in sent)
    assert reasoning == "abc def" and "".join(p.content for p in sent) == "xyz"
    assert sent[len("<think>\nabc") - 1].reasoning == "c"  # sent as it came
    assert all("<" not in p.reasoning + p.content for p in sent)


def test_unknown_prompt_holds_text_until_it_can_tell() -> None:
    parser = Qwen3ReasoningParser(prompt=None)
    assert parser.feed("maybe reasoning").reasoning == ""
    out = parser.finish()
    assert (out.reasoning, out.content) == ("", "maybe reasoning")
