"""A model line's `chat_encoder=` renders the chat prompts of `openinfer serve`: found on the
line that loads the checkpoint, carried to the frontend as its "module:Class", and used by
/v1/chat/completions and /tokenize in place of the checkpoint's own chat template (the tiny
Qwen3 checkpoint has one)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_server import MODEL, serve_in_thread
from toy_chat_encoder import TARGET, ToyChatEncoder

from openinfer_core.errors import PluginError
from openinfer_core.handle import EngineHandle
from openinfer_core.hookspecs import hookimpl
from openinfer_core.plugins import PluginManager
from openinfer_core.registry import RegisterModel
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.cli import build_parser
from openinfer_server.frontend import Frontend, _build_server
from openinfer_server.parser_choice import ParserChoice
from openinfer_server.serve import chat_encoder

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]


class ToyLine:
    """A plugin whose Qwen3 model line names `target` as its chat encoder."""

    def __init__(self, target: str | None) -> None:
        self.target = target

    @hookimpl
    def openinfer_register_models(self, register: RegisterModel) -> None:
        extra = {} if self.target is None else {"chat_encoder": self.target}
        register("toy-chat", "openinfer_qwen3.model_line:Qwen3ModelLine",
                 architectures=("Qwen3ForCausalLM",), **extra)


def test_the_model_lines_encoder_is_found(checkpoint: Path, tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    registries = PluginManager(autoload=False, plugins=[ToyLine(TARGET)]).registries
    with caplog.at_level(logging.INFO, logger="openinfer.server"):
        assert chat_encoder(registries, checkpoint) == TARGET
    assert f"the toy-chat model line's chat encoder ({TARGET})" in caplog.text
    assert chat_encoder(registries, tmp_path) is None  # no config.json: the engine says so
    plain = PluginManager(autoload=False, plugins=[ToyLine(None)]).registries
    assert chat_encoder(plain, checkpoint) is None
    broken = PluginManager(autoload=False, plugins=[ToyLine("toy_chat_encoder:Nope")])
    with pytest.raises(PluginError, match="has no attribute 'Nope'"):
        chat_encoder(broken.registries, checkpoint)


@pytest.fixture(scope="module")
def served(engine: EngineHandle, checkpoint: Path) -> Iterator[tuple[str, Tokenizer]]:
    """A frontend as `openinfer serve` builds it for a line with the toy encoder (and hermes,
    so that tools with tool_choice "auto" are accepted)."""
    frontend = Frontend(build_parser().parse_args(["serve"]), str(checkpoint), [MODEL], False,
                        0.0, parsers=ParserChoice(tool="hermes"), chat_encoder=TARGET)
    app = _build_server(frontend, engine).config.app
    tokenizer: Tokenizer = app.state.openinfer.tokenizer
    assert isinstance(tokenizer.chat_encoder, ToyChatEncoder)
    url, server, thread = serve_in_thread(app)
    yield url, tokenizer
    server.should_exit = True
    thread.join(timeout=10)


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={"model": MODEL, **body}, timeout=60)


def test_chat_and_tokenize_use_the_encoder(served: tuple[str, Tokenizer]) -> None:
    url, tokenizer = served
    options = {"thinking": True, "reasoning_effort": "max"}
    body = {"messages": MESSAGES, "tools": TOOLS, "chat_template_kwargs": options}
    text = ToyChatEncoder().render(MESSAGES, tools=TOOLS, **options)
    assert text.endswith('tools: get_time\noptions: {"reasoning_effort": "max", '
                         '"thinking": true}\nassistant:')
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert post(url, "/tokenize", body).json()["tokens"] == ids
    reply = post(url, "/v1/chat/completions", {**body, "max_tokens": 1, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] == len(ids)
    # the checkpoint's Qwen3 template would have written <|im_start|> markers
    assert "<|im_start|>" not in tokenizer.decode(ids)
    bare = post(url, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})
    assert tokenizer.decode(bare.json()["tokens"]) == "system: Be brief.\nuser: Hi!"


def test_encoder_mistakes_are_400_and_its_bugs_500(served: tuple[str, Tokenizer]) -> None:
    url, _ = served
    refused = post(url, "/v1/chat/completions",
                   {"messages": [{"role": "user", "content": "refuse"}]})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "messages"
    assert "the toy encoder refuses this" in refused.json()["error"]["message"]
    crashed = post(url, "/v1/chat/completions",
                   {"messages": [{"role": "user", "content": "crash"}]})
    assert crashed.status_code == 500


def test_the_reasoning_effort_field_reaches_the_encoder(served: tuple[str, Tokenizer]) -> None:
    url, tokenizer = served
    for body, effort in [({"reasoning_effort": "max"}, "max"),
                         ({"reasoning_effort": "low",  # chat_template_kwargs wins
                           "chat_template_kwargs": {"reasoning_effort": "high"}}, "high")]:
        ids = post(url, "/tokenize", {"messages": MESSAGES, **body}).json()["tokens"]
        assert tokenizer.decode(ids).endswith(
            f'options: {{"reasoning_effort": "{effort}"}}\nassistant:')
