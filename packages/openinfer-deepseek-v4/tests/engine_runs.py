"""Driving an in-process engine in the tests: requests arriving over steps, and their tokens."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

from openinfer_core import Engine, GenerateRequest
from openinfer_core.events import Token, TokenEvent


def run_staggered(eng: Engine, requests: Sequence[GenerateRequest],
                  arrival_step: Callable[[int], int]) -> dict[str, list[TokenEvent]]:
    """Add request i at step arrival_step(i); step until every request has ended."""
    events: dict[str, list[TokenEvent]] = defaultdict(list)
    pending = sorted(range(len(requests)), key=arrival_step)
    step = 0
    while pending or eng.has_work():
        while pending and arrival_step(pending[0]) <= step:
            eng.add_request(requests[pending.pop(0)])
        for ev in eng.step():
            events[ev.request_id].append(ev)
        step += 1
        assert step < 10_000, "engine did not finish"
    return dict(events)


def tokens(events: Sequence[TokenEvent]) -> list[int]:
    return [e.token_id for e in events if isinstance(e, Token)]
