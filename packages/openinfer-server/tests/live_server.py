"""A live uvicorn server in a background thread, and what tests share about it."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import uvicorn
from fastapi import FastAPI

from openinfer_core.handle import EngineHandle
from openinfer_core.testing import openinfer_command, wait_for_ready
from openinfer_core.text.tokenizer import Tokenizer

__all__ = ["ALIAS", "API_KEY", "MODEL", "LiveServer", "error_of", "openinfer_command",
           "serve_in_thread", "wait_for_ready"]

MODEL = "tiny-qwen3"
ALIAS = "tiny-alias"
API_KEY = "sk-test-key"


@dataclass
class LiveServer:
    url: str
    app: FastAPI
    engine: EngineHandle
    tokenizer: Tokenizer

    def client(self, **kwargs: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0,
                             timeout=60, **kwargs)  # type: ignore[arg-type]

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0,
                                  timeout=60)

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until the engine has no request and no KV block in use (aborts land a step late)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            load = self.engine.load()
            if load.running == load.waiting == load.kv_used_blocks == 0:
                return
            time.sleep(0.02)
        raise AssertionError(f"engine still busy after {timeout}s: {self.engine.load()}")


def serve_in_thread(app: FastAPI) -> tuple[str, uvicorn.Server, threading.Thread]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return url, server, thread
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError("the test server did not come up within 30 s")


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    """The OpenAI error body of `response`, after checking its status and shape."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])
