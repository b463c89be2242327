from __future__ import annotations

from typing import Any

import pytest

from openinfer_core.errors import InvalidParameterError, TokenizerError
from openinfer_core.text.chat_template import ChatTemplate

CHATML = (
    "{{ bos_token }}{% for m in messages %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _render(source: str, messages: Any, **kwargs: Any) -> str:
    return ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(messages, **kwargs)


def test_renders_messages_and_generation_prompt() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert _render(CHATML, messages) == (
        "<s><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert _render(CHATML, messages, add_generation_prompt=False).endswith("yo<|im_end|>\n")


def test_blocks_are_trimmed_and_left_stripped() -> None:
    source = (
        "{% for m in messages %}\n    {% if m.content %}\n[{{ m.content }}]\n"
        "    {% endif %}\n{% endfor %}"
    )
    assert _render(
        source, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    ) == ("[a]\n[b]\n")


def test_text_parts_are_flattened() -> None:
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        },
        {"role": "assistant", "content": None, "tool_calls": []},
    ]
    assert (
        _render("{{ messages[0].content }}|{{ messages[1].content }}", messages) == "one\ntwo|None"
    )


def test_input_messages_are_not_modified() -> None:
    parts = [{"type": "text", "text": "x"}]
    messages = [{"role": "user", "content": parts}]
    _render(CHATML, messages)
    assert messages[0]["content"] is parts


def test_tojson_keeps_non_ascii_and_extra_variables_reach_template() -> None:
    source = "{{ tools | tojson }} {{ custom }}"
    tools = [{"name": "天气", "emoji": "🎉"}]
    assert _render(source, [], tools=tools, custom=7) == '[{"name": "天气", "emoji": "🎉"}] 7'
    assert (
        _render("{{ {'a': [1, 2]} | tojson(indent=2) }}", [])
        == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    )


def test_strftime_now_and_loop_controls() -> None:
    assert len(_render("{{ strftime_now('%Y-%m-%d') }}", [])) == 10
    source = (
        "{% for m in messages %}{% if loop.index0 == 1 %}{% break %}{% endif %}"
        "{{ m.role }}{% endfor %}"
    )
    assert _render(source, [{"role": "a"}, {"role": "b"}]) == "a"


def test_raise_exception_becomes_invalid_messages() -> None:
    source = (
        "{% if messages[0].role != 'user' %}"
        "{{ raise_exception('first turn must be user') }}{% endif %}"
    )
    with pytest.raises(InvalidParameterError, match="first turn must be user") as info:
        _render(source, [{"role": "assistant", "content": "x"}])
    assert info.value.param == "messages"


def test_template_syntax_error_is_a_tokenizer_error() -> None:
    with pytest.raises(TokenizerError, match="does not compile"):
        ChatTemplate("{% for m in messages %}", bos_token=None, eos_token=None)


def test_sandbox_blocks_mutation() -> None:
    with pytest.raises(InvalidParameterError, match="chat template"):
        _render("{{ messages.append(1) }}", [])


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ("hello", "list of message objects"),
        (["hello"], r"messages\[0\] must be an object"),
        ([{"content": "x"}], r"messages\[0\].role"),
        ([{"role": 3, "content": "x"}], r"messages\[0\].role"),
        ([{"role": "user", "content": 5}], r"messages\[0\].content must be"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "only 'text' parts"),
        ([{"role": "user", "content": [{"type": "text", "text": 1}]}], r"\.text must be a string"),
        ([{"role": "user", "content": ["raw"]}], r"content\[0\] must be an object"),
    ],
)
def test_bad_messages_are_rejected_clearly(messages: Any, problem: str) -> None:
    with pytest.raises(InvalidParameterError, match=problem) as info:
        _render(CHATML, messages)
    assert info.value.param == "messages"
