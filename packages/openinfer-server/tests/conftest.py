"""A real uvicorn server on loopback serving a tiny random Qwen3 with the real Qwen tokenizer,
shared by the whole session (building the checkpoint is the slow part). The engine runs in its
own process, as under `openinfer serve`; each app holds its own `EngineClient` to it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from fastapi import FastAPI

from openinfer_core.engine.config import EngineConfig
from openinfer_core.handle import EngineHandle
from openinfer_core.ipc import EngineClient, EngineProcess
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.app import build_app

# This folder (live_server) and the root tests folder (the checkpoint writer).
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[3] / "tests"))

from live_server import ALIAS, API_KEY, MODEL, LiveServer, serve_in_thread
from qwen3_checkpoints import SPECS, write_checkpoint


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(SPECS["gqa-tied"], tmp_path_factory.mktemp("server") / "qwen3")


@pytest.fixture(scope="session")
def engine_process(checkpoint: Path) -> Iterator[EngineProcess]:
    process = EngineProcess.start(EngineConfig(model=str(checkpoint), device="cpu"), "warning")
    yield process
    process.stop()


def _client(process: EngineProcess) -> Iterator[EngineClient]:
    client = EngineClient(process.addresses, sentinel=process.sentinel)
    yield client
    client.close()


@pytest.fixture(scope="session")
def engine(engine_process: EngineProcess) -> Iterator[EngineClient]:
    yield from _client(engine_process)


@pytest.fixture(scope="session")
def tokenizer(checkpoint: Path) -> Tokenizer:
    return Tokenizer.from_dir(checkpoint)


def _live(app: FastAPI, engine: EngineHandle, tokenizer: Tokenizer) -> Iterator[LiveServer]:
    url, server, thread = serve_in_thread(app)
    yield LiveServer(url, app, engine, tokenizer)
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="session")
def server(engine: EngineClient, tokenizer: Tokenizer) -> Iterator[LiveServer]:
    """No API key; serves MODEL and ALIAS."""
    app = build_app(engine, tokenizer, served_model_names=[MODEL, ALIAS])
    yield from _live(app, engine, tokenizer)


@pytest.fixture(scope="session")
def keyed_server(engine_process: EngineProcess, tokenizer: Tokenizer) -> Iterator[LiveServer]:
    """The same engine behind a second app, a second frontend with its own client, that wants
    API_KEY (and a shorter model length)."""
    for client in _client(engine_process):
        app = build_app(client, tokenizer, served_model_names=[MODEL], api_key=API_KEY,
                        max_model_len=128)
        yield from _live(app, client, tokenizer)


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return server.client()
