"""POST /v1/responses through the unmodified openai client: a scripted model line writes fixed
Qwen3-style replies, which must come back as the same output items streamed or not, with
OpenAI's event sequence, usage, storage and errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import scripted_model
from live_server import serve_in_thread
from scripted_model import write_scripted_checkpoint

from openinfer_core.engine.async_engine import AsyncEngine
from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.plugins import PluginManager
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.app import build_app
from openinfer_server.chat_output import ChatParsers
from openinfer_server.response_store import ResponseStore, StoredResponse

MODEL = "scripted"


def hermes(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


SCRIPTS = {
    "say hello": "Hello there, friend! How are you today?",
    "think and call": "<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n"
                      + hermes("get_weather", city="Zürich"),
    "forced named": json.dumps({"city": "Paris"}, separators=(",", ":")),
    "json answer": json.dumps({"name": "Ada", "age": 36}, separators=(",", ":")),
}
TOOLS: list[Any] = [{
    "type": "function", "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False},
    "strict": True}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An app with the hermes tool-call and qwen3 reasoning parsers on the scripted line."""
    folder = write_scripted_checkpoint(tmp_path_factory.mktemp("scripted"), SCRIPTS)
    plugins = PluginManager(autoload=True, plugins=[scripted_model])
    engine = AsyncEngine(Engine(EngineConfig(model=str(folder), device="cpu",
                                             num_kv_blocks=256), plugins))
    parsers = ChatParsers.from_names(plugins.registries, "hermes", "qwen3")
    base, server, thread = serve_in_thread(build_app(
        engine, Tokenizer.from_dir(folder), served_model_names=[MODEL], parsers=parsers))
    yield base
    server.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def create(url: str, prompt: str, **kwargs: Any) -> Any:
    return client(url).responses.create(model=MODEL, input=prompt, temperature=0.0, **kwargs)


def items(response: Any) -> list[tuple[str, Any]]:
    """(type, what it holds) of each output item."""
    out: list[tuple[str, Any]] = []
    for item in response.output:
        if item.type == "message":
            out.append(("message", "".join(c.text for c in item.content)))
        elif item.type == "reasoning":
            out.append(("reasoning", "".join(c.text for c in item.content or [])))
        else:
            out.append(("function_call", (item.name, json.loads(item.arguments))))
    return out


def test_text(url: str) -> None:
    response = create(url, "say hello", instructions="Be brief.")
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "completed" and response.incomplete_details is None
    assert response.output_text == SCRIPTS["say hello"]
    [message] = response.output
    assert message.role == "assistant" and message.status == "completed"
    assert message.id.startswith("msg_") and message.content[0].annotations == []
    usage = response.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert response.instructions == "Be brief." and response.model == MODEL
    assert response.temperature == 0.0 and response.tools == []
    assert response.tool_choice == "auto" and response.parallel_tool_calls is True


def test_input_items_render_as_the_chat_messages(url: str) -> None:
    """Messages of every role, content parts, and a function call with its output render the
    very prompt that chat completions renders for the same conversation."""
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": '{"city": "Paris"}'}
    response = client(url).responses.create(model=MODEL, tools=TOOLS, max_output_tokens=1, input=[
        {"type": "message", "role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "weather "},
                                     {"type": "input_text", "text": "in Paris?"}]},
        call, {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}])
    chat_tools = [{"type": "function", "function": {
        k: v for k, v in TOOLS[0].items() if k != "type"}}]
    chat = client(url).chat.completions.create(model=MODEL, tools=chat_tools, max_tokens=1,
                                               messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    assert chat.usage is not None and response.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens


def test_max_output_tokens_makes_it_incomplete(url: str) -> None:
    response = create(url, "say hello", max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3 and response.output[0].status == "incomplete"


def test_forced_function_tool(url: str) -> None:
    response = create(url, "forced named", tools=TOOLS,
                      tool_choice={"type": "function", "name": "get_weather"})
    [call] = response.output
    assert call.type == "function_call" and call.id.startswith("fc_")
    assert call.call_id.startswith("call_") and call.status == "completed"
    assert items(response) == [("function_call", ("get_weather", {"city": "Paris"}))]
    assert response.tools[0].name == "get_weather"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_reasoning_content_and_a_call(url: str, stream: bool) -> None:
    args: dict[str, Any] = {"model": MODEL, "input": "think and call", "tools": TOOLS}
    if stream:
        with client(url).responses.stream(**args) as events:
            response = events.get_final_response()
    else:
        response = client(url).responses.create(**args)
    assert items(response) == [("reasoning", "The user wants the weather."),
                               ("message", "Let me check."),
                               ("function_call", ("get_weather", {"city": "Zürich"}))]


def test_json_schema_format(url: str) -> None:
    response = create(url, "json answer", text={"format": {
        "type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(response.output_text), PERSON)
    assert response.text.format.type == "json_schema"


def test_stream_events(url: str) -> None:
    deltas: list[str] = []
    with client(url).responses.stream(model=MODEL, input="say hello") as stream:
        kinds = []
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == SCRIPTS["say hello"] == final.output_text and len(deltas) > 1
    first = kinds.index("response.output_text.delta")
    assert kinds[:first] == ["response.created", "response.in_progress",
                             "response.output_item.added", "response.content_part.added"]
    assert set(kinds[first:-4]) == {"response.output_text.delta"}
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert final.status == "completed" and final.usage.output_tokens > 0


def test_stream_wire_format(url: str) -> None:
    """Every event: an `event:` line naming its type, `type` and consecutive
    `sequence_number`s; no [DONE]; function-call arguments streamed then done."""
    body = {"model": MODEL, "input": "forced named", "stream": True, "tools": TOOLS,
            "tool_choice": {"type": "function", "name": "get_weather"}}
    text = httpx.post(f"{url}/v1/responses", json=body, timeout=60).text
    events = [block.split("\n") for block in text.strip().split("\n\n")]
    payloads = []
    for lines in events:
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ")
        payload = json.loads(lines[1].removeprefix("data: "))
        assert payload["type"] == lines[0].removeprefix("event: ")
        payloads.append(payload)
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    kinds = [p["type"] for p in payloads]
    assert "response.function_call_arguments.delta" in kinds
    done = next(p for p in payloads if p["type"] == "response.function_call_arguments.done")
    assert json.loads(done["arguments"]) == {"city": "Paris"}
    assert kinds[-1] == "response.completed" and "[DONE]" not in text


def test_previous_response_id_chain(url: str) -> None:
    first = create(url, "say hello")
    second = create(url, "thanks", previous_response_id=first.id, max_output_tokens=1)
    assert second.previous_response_id == first.id
    chat = client(url).chat.completions.create(model=MODEL, max_tokens=1, messages=[
        {"role": "user", "content": "say hello"},
        {"role": "assistant", "content": SCRIPTS["say hello"]},
        {"role": "user", "content": "thanks"}])
    assert chat.usage is not None
    assert second.usage.input_tokens == chat.usage.prompt_tokens


def test_retrieve_and_delete(url: str) -> None:
    response = create(url, "say hello")
    assert client(url).responses.retrieve(response.id).output_text == SCRIPTS["say hello"]
    client(url).responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client(url).responses.retrieve(response.id)
    unstored = create(url, "say hello", store=False)
    with pytest.raises(openai.NotFoundError):
        client(url).responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as err:
        create(url, "more", previous_response_id=unstored.id)
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "hi", "previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": []}, "input"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "hi", "tools": [{"type": "function", "name": "bad name!"}]}, "tools[0]"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": "hi", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
     "text.format.schema"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format"),
    ({"input": "hi", "background": True}, "background"),
])
def test_bad_requests(url: str, body: dict[str, Any], param: str) -> None:
    reply = httpx.post(f"{url}/v1/responses", json={"model": MODEL, **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_store_evicts_the_least_recently_used() -> None:
    store = ResponseStore(capacity=2)
    for name in ("a", "b", "c"):
        if name == "c":
            store.get("a")  # now b is the least recently used
        store.put(StoredResponse({"id": name, "output": []}, ()))
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2
    assert store.delete("a") and not store.delete("a")


def chat_model(url: str, **kwargs: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=MODEL, base_url=f"{url}/v1", api_key="unused",  # type: ignore[arg-type]
                      use_responses_api=True, temperature=0.0, max_retries=0, **kwargs)


def test_langchain_invoke_and_stream(url: str) -> None:
    model = chat_model(url)
    reply = model.invoke("say hello")
    assert reply.text == SCRIPTS["say hello"]
    assert reply.usage_metadata is not None and reply.usage_metadata["output_tokens"] > 0
    chunks = list(model.stream("say hello"))
    assert len(chunks) > 1
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert whole.text == SCRIPTS["say hello"]


def test_langchain_bind_tools(url: str) -> None:
    def get_weather(city: str) -> str:
        """Weather in a city."""
        return "sunny"

    reply = chat_model(url).bind_tools([get_weather]).invoke("think and call")
    [call] = reply.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Zürich"}
    assert call["id"] and call["id"].startswith("call_")
    # The reply and the tool's result go back as LangChain writes them (function_call and
    # function_call_output items, the reasoning and message items of the reply).
    from langchain_core.messages import HumanMessage, ToolMessage

    after = chat_model(url).bind_tools([get_weather]).invoke([
        HumanMessage("think and call"), reply, ToolMessage("sunny", tool_call_id=call["id"]),
        HumanMessage("say hello")])
    assert after.text == SCRIPTS["say hello"]
