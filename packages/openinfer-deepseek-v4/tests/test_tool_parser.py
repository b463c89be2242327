"""The DSML tool-call parser, and core's `deepseek_r1` reasoning parser on DeepSeek-V4's
thinking output: the assistant turns of the reference's golden prompts come back as the
reference's own parser reads them (its test_case_1 expectations), whatever the chunking."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from openinfer_core.interfaces.parsers import ToolCall
from openinfer_core.text.reasoning.think import DeepSeekR1ReasoningParser
from openinfer_core.text.tool_parsers.calls import parse_all, whole_calls
from openinfer_deepseek_v4.chat.encoding import DeepseekV4ChatEncoder
from openinfer_deepseek_v4.chat.markup import ASSISTANT, EOS, THINK_START, USER
from openinfer_deepseek_v4.chat.tool_parser import DeepseekV4ToolParser

# The reference's case 1: a thinking turn that calls get_weather, its result, the answer.
GOLDEN_PROMPT = (Path(__file__).parent / "data" / "chat_encoding" / "prompt_1.txt").read_text(
    encoding="utf-8")


def block(*invokes: str) -> str:
    return "<｜DSML｜tool_calls>\n" + "\n".join(invokes) + "\n</｜DSML｜tool_calls>"


def invoke(name: str, **parameters: tuple[str, str]) -> str:
    lines = [f'<｜DSML｜invoke name="{name}">']
    lines += [f'<｜DSML｜parameter name="{k}" string="{s}">{v}</｜DSML｜parameter>'
              for k, (s, v) in parameters.items()]
    return "\n".join([*lines, "</｜DSML｜invoke>"])


def parse(text: str) -> tuple[str, list[tuple[str, Any]]]:
    content, calls = parse_all(DeepseekV4ToolParser(tools=()), text)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def chunked(text: str, sizes: list[int]) -> tuple[str, list[ToolCall]]:
    parser = DeepseekV4ToolParser(tools=())
    content, deltas, at = "", [], 0
    for size in sizes:
        out = parser.feed(text[at:at + size])
        content, deltas, at = content + out.content, deltas + list(out.calls), at + size
    out = parser.finish()
    return content + out.content, whole_calls(deltas + list(out.calls))


def split(prompt: str, which: int) -> tuple[str, str]:
    """The prompt before the `which`-th assistant turn of a golden prompt, and that turn's
    text as the model writes it (up to its end-of-sentence, which ends generation)."""
    marker = ASSISTANT + THINK_START
    start = -1
    for _ in range(which + 1):
        start = prompt.index(marker, start + 1)
    begin = start + len(marker)
    return prompt[:begin], prompt[begin:prompt.index(EOS, begin)]


def read_turn(prompt: str, text: str) -> tuple[str, str, list[ToolCall]]:
    reasoning = DeepSeekR1ReasoningParser(prompt=prompt)
    first, last = reasoning.feed(text), reasoning.finish()
    content, calls = parse_all(DeepseekV4ToolParser(tools=()), first.content + last.content)
    return first.reasoning + last.reasoning, content, calls


def test_golden_turns_read_as_the_reference_reads_them() -> None:
    prompt = GOLDEN_PROMPT
    reasoning, content, calls = read_turn(*split(prompt, 0))
    assert reasoning == ("The user wants to know the weather in Beijing. "
                         "I should use the get_weather tool.")
    assert content == ""
    [call] = calls
    assert call.name == "get_weather" and call.id.startswith("call_")
    assert call.arguments == '{"location": "Beijing", "unit": "celsius"}'  # the reference's text
    reasoning, content, calls = read_turn(*split(prompt, 1))
    assert reasoning == "Got the weather data. Let me format a nice response."
    assert content == ("The weather in Beijing is currently sunny with a temperature of 22°C "
                       "and 45% humidity.")
    assert calls == []


def test_chat_mode_output_is_all_content() -> None:
    prompt = DeepseekV4ChatEncoder().render([{"role": "user", "content": "hi"}])
    text = "Checking.\n\n" + block(invoke("search", query=("true", "V4")))
    reasoning, content, calls = read_turn(prompt, text)
    assert (reasoning, content) == ("", "Checking.")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("search", {"query": "V4"})]


def test_parameter_values() -> None:
    text = block(invoke("f", s=("true", ' 多 "quoted"\n'), n=("false", "3"), x=("false", "2.5"),
                        b=("false", "true"), z=("false", "null"), l=("false", '[1, "a"]'),
                        o=("false", '{"k": {"n": []}}'), bad=("false", "not json")),
                 '<｜DSML｜invoke name="g">\n'
                 '<｜DSML｜parameter name="plain">7</｜DSML｜parameter>\n'
                 '<｜DSML｜parameter name="word">seven</｜DSML｜parameter>\n</｜DSML｜invoke>',
                 invoke("h"))
    assert parse(text) == ("", [
        ("f", {"s": ' 多 "quoted"\n', "n": 3, "x": 2.5, "b": True, "z": None, "l": [1, "a"],
               "o": {"k": {"n": []}}, "bad": "not json"}),
        ("g", {"plain": 7, "word": "seven"}),
        ("h", {})])


def test_content_around_blocks() -> None:
    call = block(invoke("f", a=("true", "1")))
    assert parse(f"Before.\n\n{call}\n\nAfter.") == ("Before.After.", [("f", {"a": "1"})])
    assert parse(f"{call}{call}") == ("", [("f", {"a": "1"}), ("f", {"a": "1"})])
    assert parse("no calls < here ｜DSML｜ >") == ("no calls < here ｜DSML｜ >", [])


@pytest.mark.parametrize("broken", [
    block(),  # no invoke
    block(invoke("f", a=("true", "1"), b=("true", "2")).replace('"b"', '"a"')),  # repeated
    block("stray " + invoke("f")),
    block(invoke("f") + " trailing"),
    block('<｜DSML｜invoke name="">\n</｜DSML｜invoke>'),  # no name
    "<｜DSML｜tool_calls>\n" + invoke("f")[:-5],  # the output ends inside an invoke
])
def test_blocks_that_do_not_parse_stay_content(broken: str) -> None:
    assert parse("Hi.\n\n" + broken) == ("Hi.\n\n" + broken, [])


def test_missing_block_end_is_forgiven_at_the_end() -> None:
    text = "<｜DSML｜tool_calls>\n" + invoke("f", a=("false", "1")) + "\n"
    assert parse(text) == ("", [("f", {"a": 1})])


def test_every_chunking_gives_the_same_result() -> None:
    text = ("Let me look < that up.\n\n"
            + block(invoke("get_weather", city=("true", "Zürich")),
                    invoke("get_time", zone=("true", "CET"), utc=("false", "false")))
            + " \n")
    whole_content, whole = chunked(text, [len(text)])
    assert whole_content == "Let me look < that up."
    assert [(c.name, c.arguments) for c in whole] == [
        ("get_weather", '{"city": "Zürich"}'), ("get_time", '{"zone": "CET", "utc": false}')]
    for sizes in ([1] * len(text), *([cut, len(text)] for cut in range(1, len(text)))):
        content, calls = chunked(text, sizes)
        assert content == whole_content
        assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole]


def test_text_that_may_begin_a_block_is_held_back() -> None:
    parser = DeepseekV4ToolParser(tools=())
    assert parser.feed("Hi <").content == "Hi"
    assert parser.feed("｜DSML｜tool").content == ""
    assert parser.feed("tips>").content == " <｜DSML｜tooltips>"
    assert parser.finish().content == ""


def test_thinking_prompt_over_tools_opens_reasoning() -> None:
    messages = [{"role": "user", "content": "weather?"}]
    prompt = DeepseekV4ChatEncoder().render(messages, tools=[{
        "type": "function", "function": {"name": "w", "parameters": {}}}], thinking=True)
    assert prompt.endswith(USER + "weather?" + ASSISTANT + THINK_START)
    reasoning, content, calls = read_turn(prompt, "I'll call w.</think>\n\n" + block(invoke("w")))
    assert (reasoning, content, [c.name for c in calls]) == ("I'll call w.", "", ["w"])
