"""DeepSeek-V4's chat encoding against the golden prompts of the checkpoint's reference encoder
(`encoding/tests/test_input_N.json` -> `test_output_N.txt`, kept in data/chat_encoding), and
the server-facing `DeepseekV4ChatEncoder` (request tools, thinking, reasoning effort, errors).
The rendered markers encode as single ids with the real DeepSeek-V4 tokenizer."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from openinfer_core.errors import InvalidParameterError
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_deepseek_v4.chat.encoding import DeepseekV4ChatEncoder, encode_messages
from openinfer_deepseek_v4.chat.markup import (
    ASSISTANT,
    BOS,
    REASONING_EFFORT_MAX,
    THINK_END,
    THINK_START,
    USER,
)
from openinfer_deepseek_v4.tokenizer_files import write_tokenizer_files

DATA = Path(__file__).parent / "data" / "chat_encoding"
# The reference's four cases: thinking with tools over a tool round trip; thinking without
# tools (earlier reasoning dropped); DeepSeek's search agent (developer with tools,
# latest_reminder); a quick-instruction task in chat mode.
CASES = {1: True, 2: True, 3: True, 4: False}  # case -> thinking mode


def golden(case: int) -> tuple[list[dict[str, Any]], str]:
    data = json.loads((DATA / f"input_{case}.json").read_text(encoding="utf-8"))
    if isinstance(data, dict):  # case 1 keeps its tools beside the messages
        messages = data["messages"]
        messages[0]["tools"] = data["tools"]
    else:
        messages = data
    return messages, (DATA / f"prompt_{case}.txt").read_text(encoding="utf-8")


def weather_case() -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """Case 1 as an OpenAI client sends it: tools beside the messages."""
    data = json.loads((DATA / "input_1.json").read_text(encoding="utf-8"))
    return data["messages"], data["tools"], golden(1)[1]


@pytest.mark.parametrize("case", CASES)
def test_golden_prompts(case: int) -> None:
    messages, prompt = golden(case)
    assert encode_messages(messages, thinking=CASES[case]) == prompt


def test_request_tools_go_on_the_system_message() -> None:
    messages, tools, prompt = weather_case()
    first_turn = prompt[:prompt.index(ASSISTANT) + len(ASSISTANT + THINK_START)]
    encoder = DeepseekV4ChatEncoder()
    assert encoder.render(messages[:2], tools=tools, thinking=True) == first_turn
    # the tool round trip, up to the final answer, as the agent loop sends it
    history = messages[:-1]
    assert encoder.render(history, tools=tools, enable_thinking=True) == \
        prompt[:prompt.rindex(THINK_START) + len(THINK_START)]
    without_system = encoder.render(messages[1:2], tools=tools)
    assert without_system.startswith(BOS + "\n\n## Tools\n\n")
    assert without_system.endswith(USER + "What's the weather in Beijing?" + ASSISTANT + THINK_END)


def test_modes_and_reasoning_effort() -> None:
    encoder = DeepseekV4ChatEncoder()
    hello = [{"role": "user", "content": "Hello"}]
    chat = BOS + USER + "Hello" + ASSISTANT + THINK_END
    assert encoder.render(hello) == chat
    assert encoder.render(hello, thinking=False, reasoning_effort="max") == chat
    thinking = BOS + USER + "Hello" + ASSISTANT + THINK_START
    assert encoder.render(hello, thinking=True) == thinking
    for effort in ("none", "low", "medium", "high", "HIGH"):
        assert encoder.render(hello, thinking=True, reasoning_effort=effort) == thinking
    maximal = BOS + REASONING_EFFORT_MAX + USER + "Hello" + ASSISTANT + THINK_START
    assert encoder.render(hello, thinking=True, reasoning_effort="max") == maximal
    assert encoder.render(hello, thinking=True, reasoning_effort="xhigh") == maximal
    assert encoder.render(hello, add_generation_prompt=False) == BOS + USER + "Hello"
    assert encoder.render(hello, some_other_template_kwarg=1) == chat


def test_earlier_reasoning_dropped_or_kept() -> None:
    messages, prompt = golden(2)
    encoder = DeepseekV4ChatEncoder()
    history = messages[:-1]
    assert encoder.render(history, thinking=True) == prompt[:prompt.rindex(THINK_START) + 7]
    kept = encoder.render(history, thinking=True, drop_thinking=False)
    assert "The user said hello, I should greet back.</think>Hi there!" in kept
    assert encoder.render(history).count(THINK_END) == 2  # chat mode: closed blocks only


def test_openai_message_shapes() -> None:
    encoder = DeepseekV4ChatEncoder()
    call = {"id": "c1", "type": "function",
            "function": {"name": "ls", "arguments": {"path": "/tmp", "all": True}}}
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    messages = [{"role": "user", "content": parts},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": parts},
                {"role": "user", "content": "thanks"}]
    assert encoder.render(messages) == (
        BOS + USER + "a\nb" + ASSISTANT + THINK_END + "\n\n<｜DSML｜tool_calls>\n"
        '<｜DSML｜invoke name="ls">\n'
        '<｜DSML｜parameter name="path" string="true">/tmp</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="all" string="false">true</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
        + USER + "<tool_result>a\n\nb</tool_result>\n\nthanks" + ASSISTANT + THINK_END)


def test_tool_results_follow_the_call_order() -> None:
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
             for i in (1, 2)]
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "c2", "content": "second"},
                {"role": "tool", "tool_call_id": "c1", "content": "first"}]
    prompt = DeepseekV4ChatEncoder().render(messages)
    assert prompt.endswith(USER + "<tool_result>first</tool_result>\n\n"
                           "<tool_result>second</tool_result>" + ASSISTANT + THINK_END)


@pytest.mark.parametrize(("messages", "kwargs", "param", "words"), [
    ([{"role": "robot", "content": "x"}, {"role": "user", "content": "q"}], {}, "messages",
     "messages[0].role must be one of"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], {}, "messages", "text only"),
    ([{"role": "user", "content": 3}], {}, "messages", "must be a string, null or a list"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], {},
     "messages", "the last message has role 'assistant'"),
    ([{"role": "user", "content": "q"},
      {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]},
      {"role": "tool", "content": "r"}], {}, "messages", "messages[1].tool_calls[0] must look"),
    ([{"role": "user", "content": "q"},
      {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]},
      {"role": "tool", "content": "r"}], {}, "messages", "must hold a JSON object"),
    ([{"role": "user", "content": "q"}], {"thinking": "yes"}, "chat_template_kwargs",
     "thinking must be true or false"),
    ([{"role": "user", "content": "q"}], {"reasoning_effort": "huge"}, "reasoning_effort",
     "must be one of"),
    ([{"role": "user", "content": "q"}], {"tools": [{"type": "function"}]}, "tools",
     "tools[0] must look like"),
])
def test_mistakes_are_invalid_parameters(messages: list[dict[str, Any]], kwargs: dict[str, Any],
                                         param: str, words: str) -> None:
    with pytest.raises(InvalidParameterError, match=re.escape(words)) as caught:
        DeepseekV4ChatEncoder().render(messages, **kwargs)
    assert caught.value.param == param


def test_arguments_that_are_not_json_render_as_the_reference_does() -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": "not json"}}
    prompt = DeepseekV4ChatEncoder().render(
        [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call]}],
        add_generation_prompt=False)
    assert '<｜DSML｜parameter name="arguments" string="true">not json</｜DSML｜parameter>' \
        in prompt


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer_files(tmp_path_factory.mktemp("dsv4"))


@pytest.fixture(scope="module")
def tokenizer(folder: Path) -> Tokenizer:
    return Tokenizer.from_dir(folder)


def test_the_tokenizer_renders_with_the_encoder(folder: Path) -> None:
    """As the server's tokenizer does once the model line names the encoder."""
    messages, tools, prompt = weather_case()
    tokenizer = Tokenizer.from_dir(folder, chat_encoder=DeepseekV4ChatEncoder())
    assert tokenizer.apply_chat_template(messages[:-1], tools=tools, thinking=True) == \
        prompt[:prompt.rindex(THINK_START) + len(THINK_START)]


@pytest.mark.parametrize("case", CASES)
def test_markers_are_single_tokens(tokenizer: Tokenizer, case: int) -> None:
    _, prompt = golden(case)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert ids[0] == 0 and ids[-1] == 1  # BOS written by the encoding, EOS ends the last turn
    assert tokenizer.decode(ids) == prompt
    markers = {"<｜User｜>": 128803, "<｜Assistant｜>": 128804, "<think>": 128821,
               "</think>": 128822, "｜DSML｜": 128825, "<｜latest_reminder｜>": 128828,
               "<｜action｜>": 128829, "<｜end▁of▁sentence｜>": 1}
    for marker, token_id in markers.items():
        assert tokenizer.token_to_id(marker) == token_id
        assert ids.count(token_id) == prompt.count(marker), marker
