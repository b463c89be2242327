"""Tool calls and reasoning through the real app and the official openai client: a scripted
model line writes fixed Qwen3-style replies, and each must come back the same whether
streamed (reassembled as the SDK's stream helpers do) or not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import scripted_model
from live_server import serve_in_thread
from openai.lib.streaming.chat import ChatCompletionStreamState
from scripted_model import write_scripted_checkpoint

from openinfer_core.engine.async_engine import AsyncEngine
from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.plugins import PluginManager
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.app import build_app
from openinfer_server.chat_output import ChatParsers

MODEL = "scripted"


def hermes(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


SCRIPTS = {
    "parallel calls": hermes("get_weather", city="Paris") + "\n" + hermes("get_time", zone="CET"),
    "think and call": "<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n"
                      + hermes("get_weather", city="Zürich"),
    "just think": "<think>\nHmm, 2+2 is 4.\n</think>\n\nIt is 4. 🎉",
    "broken call": '<tool_call>\n{"name": get_weather}\n</tool_call>',
    # compact, as the grammar that forces a tool choice writes JSON
    "forced required": json.dumps([{"name": "get_weather", "parameters": {"city": "Paris"}},
                                   {"name": "get_time", "parameters": {}}], separators=(",", ":")),
    "forced named": json.dumps({"city": "Paris"}, separators=(",", ":")),
    # triggered by a legacy role "function" message's content, once rendered
    "legacy result": "It is sunny in Paris.",
}
TOOLS: list[Any] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object",
                                           "properties": {"zone": {"type": "string"}}}}},
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """URLs of two apps on one engine of the scripted line: "parsed" (hermes and qwen3) and
    "plain" (no parsers); "folder": the checkpoint."""
    folder = write_scripted_checkpoint(tmp_path_factory.mktemp("scripted"), SCRIPTS)
    plugins = PluginManager(autoload=True, plugins=[scripted_model])
    engine = AsyncEngine(Engine(EngineConfig(model=str(folder), device="cpu",
                                             num_kv_blocks=256), plugins))
    tokenizer = Tokenizer.from_dir(folder)
    regs = plugins.registries
    apps = {"parsed": ChatParsers.from_names(regs, "hermes", "qwen3"),
            "plain": ChatParsers.from_names(regs, None, None)}
    running = {name: serve_in_thread(build_app(engine, tokenizer, served_model_names=[MODEL],
                                               parsers=parsers))
               for name, parsers in apps.items()}
    yield {"folder": str(folder)} | {name: url for name, (url, _, _) in running.items()}
    for _, server, thread in running.values():
        server.should_exit = True
        thread.join(timeout=10)
    engine.shutdown()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def ask(url: str, trigger: str, *, stream: bool, **kwargs: Any) -> list[dict[str, Any]]:
    """Each choice's message fields (ids left out) and finish reason; a stream is
    reassembled by the SDK's own `ChatCompletionStreamState`."""
    args: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": trigger}],
                            "max_tokens": 200, "temperature": 0.0, **kwargs}
    if stream:
        state = ChatCompletionStreamState()
        for chunk in client(url).chat.completions.create(**args, stream=True):
            state.handle_chunk(chunk)
        choices: Any = state.get_final_completion().choices
    else:
        choices = client(url).chat.completions.create(**args).choices
    return [summary(c) for c in choices]


def summary(choice: Any) -> dict[str, Any]:
    message = choice.message
    extra = message.model_extra or {}
    calls = message.tool_calls
    for call in calls or []:
        assert call.id.startswith("call_") and call.type == "function"
    return {"content": message.content,
            "reasoning_content": extra.get("reasoning_content"),  # a null one is never streamed
            "tool_calls": None if calls is None else
            [(c.function.name, json.loads(c.function.arguments)) for c in calls],
            "finish_reason": choice.finish_reason}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_parallel_tool_calls(servers: dict[str, str], stream: bool) -> None:
    choices = ask(servers["parsed"], "parallel calls", stream=stream, tools=TOOLS, n=2)
    assert choices == 2 * [{
        "content": None, "reasoning_content": None,
        "tool_calls": [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})],
        "finish_reason": "tool_calls"}]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_reasoning_then_content_then_a_call(servers: dict[str, str], stream: bool) -> None:
    [choice] = ask(servers["parsed"], "think and call", stream=stream, tools=TOOLS)
    assert choice == {"content": "Let me check.",
                      "reasoning_content": "The user wants the weather.",
                      "tool_calls": [("get_weather", {"city": "Zürich"})],
                      "finish_reason": "tool_calls"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_reasoning_split_without_tools(servers: dict[str, str], stream: bool) -> None:
    [choice] = ask(servers["parsed"], "just think", stream=stream)
    assert choice == {"content": "It is 4. 🎉", "reasoning_content": "Hmm, 2+2 is 4.",
                      "tool_calls": None, "finish_reason": "stop"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_enable_thinking_false_reaches_the_qwen3_template(servers: dict[str, str],
                                                          stream: bool) -> None:
    """The template then closes an empty think block in the prompt, so the parser reads the
    whole output as content (this script writes its think block anyway)."""
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    [choice] = ask(servers["parsed"], "just think", stream=stream, extra_body=off)
    assert choice == {"content": SCRIPTS["just think"], "reasoning_content": None,
                      "tool_calls": None, "finish_reason": "stop"}
    on, no = (client(servers["parsed"]).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=1,
        extra_body=body) for body in ({}, off))
    assert on.usage is not None and no.usage is not None
    assert no.usage.prompt_tokens == on.usage.prompt_tokens + 4  # "<think>\n\n</think>\n\n"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_malformed_call_stays_content(servers: dict[str, str], stream: bool) -> None:
    [choice] = ask(servers["parsed"], "broken call", stream=stream, tools=TOOLS)
    assert choice == {"content": SCRIPTS["broken call"], "reasoning_content": None,
                      "tool_calls": None, "finish_reason": "stop"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_forced_tool_choices(servers: dict[str, str], stream: bool) -> None:
    # structured.py's grammar forces these shapes; the scripted model writes within them.
    [required] = ask(servers["plain"], "forced required", stream=stream, tools=TOOLS,
                     tool_choice="required")
    assert required == {"content": None, "reasoning_content": None,
                        "tool_calls": [("get_weather", {"city": "Paris"}), ("get_time", {})],
                        "finish_reason": "tool_calls"}
    named = {"type": "function", "function": {"name": "get_weather"}}
    [choice] = ask(servers["plain"], "forced named", stream=stream, tools=TOOLS,
                   tool_choice=named)
    assert choice == {"content": None, "reasoning_content": None,
                      "tool_calls": [("get_weather", {"city": "Paris"})],
                      "finish_reason": "stop"}  # as OpenAI and vLLM for a named choice


def test_tool_call_chunks_are_openai_shaped(servers: dict[str, str]) -> None:
    stream = client(servers["parsed"]).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "think and call"}], tools=TOOLS,
        temperature=0.0, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert deltas[0].role == "assistant" and deltas[0].content is None
    assert all("<" not in (d.content or "") for d in deltas)  # no tag leaks, even in part
    assert any((d.model_extra or {}).get("reasoning_content") for d in deltas)
    [first] = [call for d in deltas for call in d.tool_calls or []]
    assert first.index == 0 and first.id and first.id.startswith("call_")
    assert first.type == "function" and first.function is not None
    assert first.function.name == "get_weather"
    assert json.loads(first.function.arguments or "") == {"city": "Zürich"}


def test_plain_server(servers: dict[str, str]) -> None:
    """No parsers: reasoning stays in the content, no `reasoning_content`, no `tool_calls`
    key, and tools with an "auto" choice are refused with the flags to pass."""
    out = client(servers["plain"]).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "just think"}], temperature=0.0)
    message = out.choices[0].message
    assert message.content == SCRIPTS["just think"] and message.refusal is None
    assert "reasoning_content" not in (message.model_extra or {})
    assert "tool_calls" not in message.model_fields_set
    with pytest.raises(openai.BadRequestError) as err:
        client(servers["plain"]).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "parallel calls"}], tools=TOOLS)
    assert "--tool-call-parser" in str(err.value) and "hermes" in str(err.value)
    assert err.value.body["param"] == "tool_choice"  # type: ignore[index]
    # tool_choice "none": the tools reach the template, the output stays text
    out = client(servers["parsed"]).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "parallel calls"}], tools=TOOLS,
        tool_choice="none", temperature=0.0)
    assert out.choices[0].message.content == SCRIPTS["parallel calls"]
    assert out.choices[0].message.tool_calls is None


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_parallel_tool_calls_false_keeps_the_first_auto_call(servers: dict[str, str],
                                                            stream: bool) -> None:
    """vLLM's rule: the calls after the first are dropped."""
    choices = ask(servers["parsed"], "parallel calls", stream=stream, tools=TOOLS,
                  parallel_tool_calls=False, n=2)
    assert choices == 2 * [{"content": None, "reasoning_content": None,
                            "tool_calls": [("get_weather", {"city": "Paris"})],
                            "finish_reason": "tool_calls"}]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_parallel_tool_calls_false_bounds_the_required_array(servers: dict[str, str],
                                                             stream: bool) -> None:
    """The grammar then admits a one-element array only: where the script would go on to a
    second call, "]" is the one token it allows, and then the end."""
    [required] = ask(servers["plain"], "forced required", stream=stream, tools=TOOLS,
                     tool_choice="required", parallel_tool_calls=False)
    assert required == {"content": None, "reasoning_content": None,
                        "tool_calls": [("get_weather", {"city": "Paris"})],
                        "finish_reason": "tool_calls"}
    # The model stopped there (not only the parser dropping a second call): fewer tokens.
    one, both = (client(servers["plain"]).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "forced required"}], tools=TOOLS,
        tool_choice="required", parallel_tool_calls=parallel) for parallel in (False, True))
    assert one.usage is not None and both.usage is not None
    first = json.dumps([{"name": "get_weather", "parameters": {"city": "Paris"}}],
                       separators=(",", ":"))
    assert one.usage.completion_tokens < both.usage.completion_tokens
    assert one.usage.completion_tokens <= len(Tokenizer.from_dir(servers["folder"]).encode(
        first, add_special_tokens=False)) + 1  # the end token
