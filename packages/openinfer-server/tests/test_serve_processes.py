"""`openinfer serve` as processes: the engine in its own process behind one or two HTTP
frontends. Killing the engine mid-stream ends the stream with an error event, /health answers
503 (and so does a new request, with Retry-After), the server exits non-zero and leaves no
process behind; SIGTERM lets a stream finish and exits 0, or at --shutdown-timeout ends the
requests still running with an error event then [DONE] (a 503 when not streamed); a killed
server takes its engine with it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@contextlib.contextmanager
def _serve(frontends: int, checkpoint: Path, log: Path,
           shutdown_timeout: int) -> Iterator[Served]:
    env = {**os.environ}
    env.pop("OPENINFER_API_KEY", None)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*openinfer_command(), "serve", str(checkpoint), "--device", "cpu", "--port", "0"
             if frontends == 1 else str(_free_port()), "--served-model-name", "m",
             "--api-server-count", str(frontends), "--shutdown-timeout", str(shutdown_timeout)],
            stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url = wait_for_ready(proc, log, timeout=180)
        if frontends == 2:  # both frontends up
            deadline = time.monotonic() + 60
            while log.read_text().count("ready in") < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
        yield Served(proc, log, url)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.fixture(params=[1, 2], ids=["one-frontend", "two-frontends"])
def served(request: pytest.FixtureRequest, checkpoint: Path,
           tmp_path: Path) -> Iterator[Served]:
    with _serve(request.param, checkpoint, tmp_path / "serve.log", 20) as served:
        yield served


@pytest.fixture(params=[1, 2], ids=["one-frontend", "two-frontends"])
def served_briefly(request: pytest.FixtureRequest, checkpoint: Path,
                   tmp_path: Path) -> Iterator[Served]:
    """--shutdown-timeout 1: too short for a long request to finish."""
    with _serve(request.param, checkpoint, tmp_path / "serve.log", 1) as served:
        yield served


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
    assert error["code"] == "engine_dead", error
    # Until the server exits, whatever needs the engine is a 503 with Retry-After.
    health = httpx.get(f"{served.url}/health", timeout=5)
    assert health.status_code == 503, health.text
    assert "engine" in health.json()["error"]["message"]
    late = httpx.post(f"{served.url}/v1/completions", timeout=5,
                      json={"model": "m", "prompt": "Hello", "max_tokens": 4})
    assert late.status_code == 503, late.text
    assert late.json()["error"]["code"] == "engine_dead"
    assert late.headers["retry-after"] == "5"
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


def test_sigterm_deadline_ends_streams_with_an_error_then_done(served_briefly: Served) -> None:
    """Requests that cannot finish within --shutdown-timeout: each stream ends with an error
    event and [DONE] in a complete body, a non-streamed request gets a 503; no traceback."""
    served = served_briefly
    body = {"model": "m", "prompt": "Hello", "max_tokens": 500, "ignore_eos": True}
    results: dict[int, Any] = {}
    first_tokens = threading.Barrier(4)  # the 3 streams and this thread

    def stream(i: int) -> None:
        try:
            with httpx.stream("POST", f"{served.url}/v1/completions", timeout=60,
                              json={**body, "stream": True}) as response:
                lines = []
                for line in response.iter_lines():  # a cut body raises here
                    if line.startswith("data: "):
                        lines.append(line.removeprefix("data: "))
                        if len(lines) == 1:
                            first_tokens.wait(30)
            results[i] = lines
        except Exception as exc:
            results[i] = exc
            first_tokens.abort()

    def plain() -> None:
        results[3] = httpx.post(f"{served.url}/v1/completions", json=body, timeout=60)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
    threads.append(threading.Thread(target=plain))
    for thread in threads:
        thread.start()
    first_tokens.wait(30)
    _wait_running(served.url, 4)  # the non-streamed request too
    served.proc.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(30)
    assert served.proc.wait(timeout=30) == 0, served.log.read_text()
    for i in range(3):
        assert isinstance(results[i], list), results[i]
        assert results[i][-1] == "[DONE]"
        error = json.loads(results[i][-2])["error"]
        assert (error["message"], error["code"]) == ("server shutting down",
                                                     "server_shutting_down"), results[i][-3:]
    assert results[3].status_code == 503, results[3].text
    assert results[3].json()["error"]["message"] == "server shutting down"
    assert results[3].headers["retry-after"] == "5"
    text = served.log.read_text()
    assert "still open after --shutdown-timeout 1 s" in text, text
    assert "Traceback" not in text and "CancelledError" not in text, text


def _wait_running(url: str, count: int, timeout: float = 30.0) -> None:
    line = f'openinfer:num_requests_running{{model_name="m"}} {float(count)}'
    deadline = time.monotonic() + timeout
    while line not in httpx.get(f"{url}/metrics", timeout=5).text:
        assert time.monotonic() < deadline, f"not {count} requests running after {timeout} s"
        time.sleep(0.05)


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
