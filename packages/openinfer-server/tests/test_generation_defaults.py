"""--generation-config: a checkpoint's recommended sampling settings become the defaults of
the fields a request leaves out; `vllm` keeps the built-in ones."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_server import MODEL, serve_in_thread

from openinfer_core.generation_config import sampling_defaults
from openinfer_core.handle import EngineHandle
from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.app import build_app
from openinfer_server.cli import build_parser
from openinfer_server.frontend import Frontend, _build_server
from openinfer_server.serve import generation_defaults

RECOMMENDED = {"temperature": 0.25, "top_p": 0.5, "top_k": 7, "min_p": 0.05,
               "repetition_penalty": 1.1, "max_new_tokens": 5}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
COMPLETION = {"model": MODEL, "prompt": "Hi"}


class Recording:
    """The engine, noting every request the app submits."""

    def __init__(self, engine: EngineHandle) -> None:
        self._engine = engine
        self.requests: list[GenerateRequest] = []

    def generate(self, request: GenerateRequest) -> Any:
        self.requests.append(request)
        return self._engine.generate(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("generation-config")
    (folder / "generation_config.json").write_text(json.dumps(RECOMMENDED))
    return folder


@pytest.fixture(scope="module", params=["auto", "vllm"])
def served(request: pytest.FixtureRequest, engine: EngineHandle, tokenizer: Tokenizer,
           model_folder: Path) -> Iterator[tuple[str, str, Recording]]:
    recording = Recording(engine)
    app = build_app(recording, tokenizer, served_model_names=[MODEL],  # type: ignore[arg-type]
                    sampling_defaults=sampling_defaults(request.param, model_folder))
    url, server, thread = serve_in_thread(app)
    yield request.param, url, recording
    server.should_exit = True
    thread.join(timeout=10)


def sent(served: tuple[str, str, Recording], path: str, body: dict[str, Any]) -> SamplingParams:
    """The sampling params the engine got for this request. Streamed, and left after the
    first chunk: without max_tokens a chat request could run to the end of the context."""
    _, url, recording = served
    before = len(recording.requests)
    with httpx.stream("POST", f"{url}{path}", json={**body, "stream": True},
                      timeout=60) as response:
        assert response.status_code == 200, response.read()
        next(response.iter_lines())
    [request] = recording.requests[before:]
    return request.params


def test_left_out_fields_get_the_checkpoints_defaults(served: tuple[str, str, Recording]
                                                      ) -> None:
    mode = served[0]
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        params = sent(served, path, body)
        got = (params.temperature, params.top_p, params.top_k, params.min_p,
               params.repetition_penalty)
        if mode == "auto":
            assert got == (0.25, 0.5, 7, 0.05, 1.1), path
        else:
            assert got == (1.0, 1.0, -1, 0.0, 1.0), path
    # max_new_tokens is chat's default max_tokens (without it: the rest of the context);
    # completions keep OpenAI's default of 16, as in vLLM, whose field defaults to 16.
    chat_max = sent(served, "/v1/chat/completions", CHAT).max_tokens
    assert chat_max == 5 if mode == "auto" else chat_max > 400
    assert sent(served, "/v1/completions", COMPLETION).max_tokens == 16


def test_a_request_overrides_the_defaults(served: tuple[str, str, Recording]) -> None:
    given = {"temperature": 0.9, "top_p": 0.8, "top_k": 3, "min_p": 0.0,
             "repetition_penalty": 1.0, "max_tokens": 2}
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        params = sent(served, path, {**body, **given})
        assert (params.temperature, params.top_p, params.top_k, params.min_p,
                params.repetition_penalty, params.max_tokens) == (0.9, 0.8, 3, 0.0, 1.0, 2)
    assert sent(served, "/v1/chat/completions",
                {**CHAT, "max_completion_tokens": 3}).max_tokens == 3


def test_the_flag_reaches_the_frontends_app(model_folder: Path, engine: EngineHandle,
                                            checkpoint: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    parser = build_parser()
    assert parser.parse_args(["serve"]).generation_config == "auto"
    args = parser.parse_args(["serve", "--generation-config", "vllm"])
    assert generation_defaults(args.generation_config, model_folder) == {}
    args = parser.parse_args(["serve", "--generation-config", str(model_folder)])
    with caplog.at_level(logging.INFO, logger="openinfer.server"):
        defaults = generation_defaults(args.generation_config, checkpoint)
    assert defaults == {**{k: v for k, v in RECOMMENDED.items() if k != "max_new_tokens"},
                        "max_tokens": 5}
    assert "--generation-config vllm" in caplog.text
    assert f"default sampling params from {model_folder}: {defaults}" in caplog.text
    frontend = Frontend(argparse.Namespace(**vars(args)), str(checkpoint), [MODEL], False, 0.0,
                        defaults)
    app = _build_server(frontend, engine).config.app
    assert app.state.openinfer.sampling_defaults == defaults


def test_a_bad_flag_value_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--generation-config", "hf"])
    assert exit_info.value.code == 2
    assert "--generation-config: must be auto, vllm or a folder, got 'hf'" in \
        capsys.readouterr().err
