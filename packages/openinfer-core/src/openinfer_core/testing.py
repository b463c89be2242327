"""Driving an in-process `Engine` in tests, for openinfer's own and for model-line plugins':
requests that join the running batch at chosen steps, and the tokens each one got; and two
models' teacher-forced prompt logprobs compared (`prompt_logprobs`, `logprob_drift`), as the
FP8 numerics checks do; and `openinfer serve` run as a user runs it (`served_demo`)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from openinfer_core.engine.engine import Engine
from openinfer_core.events import PromptLogprobs, Token, TokenEvent
from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest


def run_staggered(engine: Engine, requests: Sequence[GenerateRequest],
                  arrival_step: Callable[[int], int],
                  max_steps: int = 10_000) -> dict[str, list[TokenEvent]]:
    """Add request i at step `arrival_step(i)`; step until every request has ended. Returns
    each request's events in order."""
    events: dict[str, list[TokenEvent]] = defaultdict(list)
    pending = sorted(range(len(requests)), key=arrival_step)
    step = 0
    while pending or engine.has_work():
        while pending and arrival_step(pending[0]) <= step:
            engine.add_request(requests[pending.pop(0)])
        for ev in engine.step():
            events[ev.request_id].append(ev)
        step += 1
        assert step < max_steps, "engine did not finish"
    return dict(events)


def tokens_of(events: Sequence[TokenEvent]) -> list[int]:
    """The token ids among a request's events."""
    return [e.token_id for e in events if isinstance(e, Token)]


def prompt_logprobs(engine: Engine, prompts: Sequence[Sequence[int]]) -> list[PromptLogprobs]:
    """Each prompt's teacher-forced logprobs (its tokens' and the best token's at every
    position), all prompts in one running batch."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    requests = [GenerateRequest(f"lp{i}", tuple(p), params) for i, p in enumerate(prompts)]
    events = run_staggered(engine, requests, arrival_step=lambda i: 0)
    found = [[e for e in events[r.request_id] if isinstance(e, PromptLogprobs)]
             for r in requests]
    assert all(len(f) == 1 for f in found), "one PromptLogprobs event per request"
    return [f[0] for f in found]


def logprob_drift(a: Sequence[PromptLogprobs], b: Sequence[PromptLogprobs]
                  ) -> dict[str, float]:
    """Model b against model a over the same prompts: |Δ logprob| of the prompt tokens
    (mean, p99, max), top-1 agreement (the share of positions whose best token is the same)
    and the positions compared."""
    deltas: list[float] = []
    agree = 0
    for pa, pb in zip(a, b, strict=True):
        deltas += [abs(x - y) for x, y in zip(pa.logprobs, pb.logprobs, strict=True)]
        agree += sum(ta[0][0] == tb[0][0] for ta, tb in zip(pa.top, pb.top, strict=True))
    deltas.sort()
    n = len(deltas)
    return {"positions": n, "dlogprob_mean": sum(deltas) / n,
            "dlogprob_p99": deltas[min(n - 1, math.ceil(0.99 * n) - 1)],
            "dlogprob_max": deltas[-1], "top1_agreement": agree / n}


def openinfer_command() -> list[str]:
    """The installed console script, as a user runs it."""
    script = Path(sys.executable).parent / "openinfer"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "openinfer_server.cli"]


def wait_for_ready(proc: subprocess.Popen[str], log: Path, timeout: float) -> str:
    """The URL `openinfer serve` logs once ready (the first, with several frontends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(r"ready in [\d.]+ s: (http://\S+)", log.read_text())
        if match:
            return match.group(1)
        if proc.poll() is not None:
            raise AssertionError(f"openinfer serve exited early:\n{log.read_text()}")
        time.sleep(0.2)
    raise AssertionError(f"openinfer serve not ready after {timeout}s:\n{log.read_text()}")


@contextmanager
def served_demo(demo: str, root: Path, timeout: float = 240) -> Iterator[str]:
    """`openinfer serve --demo <demo>` on the CPU (max_model_len 512, any free port) in a
    subprocess, its demo checkpoint cached under `root / "cache"` and its log in
    `root / "serve.log"`. Yields the server's URL once ready; stops the server after."""
    log = root / "serve.log"
    env = {**os.environ, "OPENINFER_CACHE_DIR": str(root / "cache")}
    env.pop("OPENINFER_API_KEY", None)
    with log.open("w") as out:
        proc = subprocess.Popen([*openinfer_command(), "serve", "--demo", demo, "--device", "cpu",
                                 "--port", "0", "--max-model-len", "512"],
                                stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        yield wait_for_ready(proc, log, timeout)
    finally:
        proc.terminate()
        proc.wait(30)
