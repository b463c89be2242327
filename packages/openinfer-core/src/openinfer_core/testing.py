"""Driving an in-process `Engine` in tests, for openinfer's own and for model-line plugins':
requests that join the running batch at chosen steps, and the tokens each one got."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

from openinfer_core.engine.engine import Engine
from openinfer_core.events import Token, TokenEvent
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
