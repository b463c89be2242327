"""`openinfer serve` as processes: the engine in its own process behind one or two HTTP
frontends. Killing the engine mid-stream ends the stream with an error event, /health answers
503, the server exits non-zero and leaves no process behind; SIGTERM lets a stream finish and
exits 0; a killed server takes its engine with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from live_server import openinfer_command, wait_for_ready
from processes import children, comm, wait_gone

pytestmark = pytest.mark.slow


class Served:
    def __init__(self, proc: subprocess.Popen[str], log: Path, url: str) -> None:
        self.proc, self.log, self.url = proc, log, url

    def engine_pid(self) -> int:
        [pid] = [p for p in children(self.proc.pid) if comm(p) == "openinfer-core"]
        return pid


@pytest.fixture(params=[1, 2], ids=["one-frontend", "two-frontends"])
def served(request: pytest.FixtureRequest, checkpoint: Path,
           tmp_path: Path) -> Iterator[Served]:
    log = tmp_path / "serve.log"
    env = {**os.environ}
    env.pop("OPENINFER_API_KEY", None)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*openinfer_command(), "serve", str(checkpoint), "--device", "cpu", "--port", "0"
             if request.param == 1 else str(_free_port()), "--served-model-name", "m",
             "--api-server-count", str(request.param), "--shutdown-timeout", "20"],
            stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url = wait_for_ready(proc, log, timeout=180)
        if request.param == 2:  # both frontends up
            deadline = time.monotonic() + 60
            while log.read_text().count("ready in") < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
        yield Served(proc, log, url)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stream_lines(url: str, max_tokens: int) -> Iterator[str]:
    body = {"model": "m", "prompt": "Hello", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                yield line.removeprefix("data: ")


def test_engine_killed_mid_stream(served: Served) -> None:
    descendants = children(served.proc.pid)
    engine = served.engine_pid()
    events = []
    for data in stream_lines(served.url, max_tokens=400):
        events.append(data)
        if len(events) == 3:
            os.kill(engine, signal.SIGKILL)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "engine process died" in error["message"], error
    health = httpx.get(f"{served.url}/health", timeout=5)
    assert health.status_code == 503, health.text
    assert "engine" in health.json()["error"]["message"]
    assert served.proc.wait(timeout=30) == 1, served.log.read_text()
    assert wait_gone(descendants) == [], served.log.read_text()


def test_sigterm_drains_a_stream_then_exits_0(served: Served) -> None:
    descendants = children(served.proc.pid)
    events = []
    for data in stream_lines(served.url, max_tokens=60):
        events.append(data)
        if len(events) == 2:
            served.proc.send_signal(signal.SIGTERM)
    assert events[-1] == "[DONE]"
    finals = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert finals[-1]["finish_reason"] == "length"
    assert sum(1 for c in finals if c["text"]) >= 50  # every token came, not an error
    assert served.proc.wait(timeout=60) == 0, served.log.read_text()
    assert wait_gone(descendants) == []
    assert "Traceback" not in served.log.read_text()


def test_a_killed_server_leaves_no_process(served: Served) -> None:
    # By the way: the checkpoint's sampling defaults are logged once, however many frontends.
    text = served.log.read_text()
    assert text.count("default sampling params from model: {'temperature': 0.6, 'top_k': 20, "
                      "'top_p': 0.95}") == 1, text
    descendants = children(served.proc.pid)
    assert served.engine_pid() in descendants
    served.proc.kill()
    served.proc.wait(10)
    assert wait_gone(descendants) == []
