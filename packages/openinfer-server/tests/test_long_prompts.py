"""A long prompt delays only itself: it is refused, or tokenized on a worker thread, while the
event loop goes on answering /health within 100 ms."""

from __future__ import annotations

import json
import statistics
import threading
import time
from typing import Any

import httpx
import pytest
from live_server import LiveServer

TWENTY_MB = 20_000_000
SLOW_HEALTH_S = 0.1


def _health_latencies_while(server: LiveServer, requests: list[tuple[str, bytes]],
                            ) -> tuple[list[float], list[int]]:
    """/health latencies sampled one after another while `requests` (path, JSON body) are in
    flight, each from its own thread; and their statuses, in order."""
    statuses = [0] * len(requests)

    def send(i: int, path: str, body: bytes) -> None:
        response = httpx.post(f"{server.url}{path}", content=body, timeout=120,
                              headers={"Content-Type": "application/json"})
        statuses[i] = response.status_code

    threads = [threading.Thread(target=send, args=(i, *r)) for i, r in enumerate(requests)]
    latencies: list[float] = []
    with httpx.Client(base_url=server.url, timeout=60) as health:
        health.get("/health")  # the connection, opened before timing
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            started = time.perf_counter()
            assert health.get("/health").status_code == 200
            latencies.append(time.perf_counter() - started)
            time.sleep(0.005)
    for t in threads:
        t.join()
    return latencies, statuses


def _report(latencies: list[float]) -> str:
    ms = sorted(round(x * 1000, 1) for x in latencies)
    return f"{len(ms)} samples, median {statistics.median(ms)} ms, slowest {ms[-5:]} ms"


def _check_health_stays_quick(server: LiveServer, requests: list[tuple[str, bytes]],
                              statuses: list[int]) -> None:
    """/health answers within SLOW_HEALTH_S throughout, in one of two tries: a stall that the
    requests cause comes back every time, a hiccup of a loaded machine's scheduler seldom
    twice in a row."""
    reports = []
    for _ in range(2):
        latencies, got = _health_latencies_while(server, requests)
        assert got == statuses
        assert len(latencies) >= 3, _report(latencies)
        if max(latencies) < SLOW_HEALTH_S:
            return
        reports.append(_report(latencies))
    raise AssertionError(f"/health took {SLOW_HEALTH_S * 1000:.0f} ms or more: {reports}")


def _body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()  # made before timing: the client's work, not ours


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_a_20_mb_prompt_does_not_delay_health(server: LiveServer, path: str) -> None:
    text = "hello world " * (TWENTY_MB // 12)
    body = _body(messages=[{"role": "user", "content": text}]) if "chat" in path \
        else _body(prompt=text)
    # Refused: more characters than max_model_len tokens can hold.
    _check_health_stays_quick(server, [(path, body)], [400])


def test_prompts_tokenized_on_worker_threads_do_not_delay_health(server: LiveServer) -> None:
    """Prompts just within the character bound are really tokenized (~0.3 s each here, which
    on the loop would hold /health that long), then refused or counted."""
    text = "hello world " * (512 * 512 // 12 - 10)  # room for the chat template's own
    chat = [{"role": "user", "content": text}]
    requests = [
        ("/v1/completions", _body(prompt=text, max_tokens=1)),
        ("/v1/completions", _body(prompt=[text, text], max_tokens=1)),
        ("/v1/chat/completions", _body(messages=chat)),
        ("/tokenize", _body(prompt=text)),
        ("/tokenize", _body(messages=chat)),
        ("/detokenize", _body(tokens=[14990, 1879] * 50_000)),
    ]
    started = time.perf_counter()
    # Too many tokens, or counted.
    _check_health_stays_quick(server, requests, [400, 400, 400, 200, 200, 200])
    assert time.perf_counter() - started > 3 * SLOW_HEALTH_S  # long enough to see a stall
