"""One HTTP generation request: its engine requests (`run_plan.build_runs`), streamed or
collected.

Completions and chat differ only in how a choice is rendered; they hand a `Renderer` to
`respond()`, which owns the engine requests from submission to abort or completion."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import Request
from starlette.responses import JSONResponse, Response

from openinfer_server.availability import Shutdown
from openinfer_server.choice import ChoiceDelta, ChoiceRun, PromptScores
from openinfer_server.errors import APIError
from openinfer_server.logprobs import TokenLogprob
from openinfer_server.streaming import (
    DONE,
    ClientGone,
    EventStreamResponse,
    sse,
    until_disconnected,
)

log = logging.getLogger("openinfer.server")

_END = object()


@dataclass(slots=True)
class ChoiceResult:
    """A whole choice, for non-streamed responses."""

    index: int
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt: PromptScores | None = None


class Renderer(Protocol):
    """The wire format of one endpoint."""

    def opening(self, index: int) -> dict[str, Any] | None:
        """A chunk sent for each choice before its first delta, or None."""

    def chunk(self, delta: ChoiceDelta) -> dict[str, Any] | None:
        """The streamed chunk for `delta`, or None to send nothing."""

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]: ...

    def response(self, choices: list[ChoiceResult], usage: dict[str, Any]) -> dict[str, Any]: ...


def usage(runs: Sequence[ChoiceRun], n: int) -> dict[str, Any]:
    """OpenAI counts each prompt once however many choices it has."""
    firsts = [r for r in runs if r.index % n == 0]
    prompt = sum(r.prompt_tokens for r in firsts)
    completion = sum(r.completion_tokens for r in runs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(r.cached_tokens for r in firsts)}}


async def respond(request: Request, runs: list[ChoiceRun], renderer: Renderer, *, n: int,
                  stream: bool, include_usage: bool, shutdown: Shutdown) -> Response:
    """Submit every run, then answer: JSON once all are done, or an event stream.
    Whatever happens (errors, the client leaving, the shutdown deadline), no engine request
    outlives this."""
    events = (lambda: _event_stream(runs, renderer, n, include_usage)) if stream else None
    return await respond_with(request, runs,
                              lambda choices: renderer.response(choices, usage(runs, n)),
                              events, shutdown=shutdown)


async def respond_with(request: Request, runs: list[ChoiceRun],
                       whole: Callable[[list[ChoiceResult]], dict[str, Any]],
                       events: Callable[[], AsyncGenerator[str, None]] | None, *,
                       shutdown: Shutdown) -> Response:
    """`respond` for any wire format: submit every run, then answer with `whole(choices)` as
    JSON once all are done or, given `events`, stream the SSE strings it makes (it reads the
    runs; they are closed when the stream ends). No engine request outlives this."""
    handed_off = False
    try:
        try:
            await until_disconnected(request, _start_all(runs), shutdown=shutdown)
            if events is None:
                choices = await until_disconnected(request, _collect(runs), shutdown=shutdown)
                return JSONResponse(whole(choices))
        except ClientGone:
            return Response(status_code=499)
        handed_off = True
        # on_close: the stream may be closed before it ever started (client already gone).
        return EventStreamResponse(events(), on_close=lambda: _close_all(runs),
                                   shutdown=shutdown)
    finally:
        if not handed_off:
            await _close_all(runs)


async def _start_all(runs: list[ChoiceRun]) -> None:
    await _all(run.start() for run in runs)


async def _all(coros: Any) -> list[Any]:
    """Run concurrently; on the first failure cancel the rest and raise that failure."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


async def _collect(runs: list[ChoiceRun]) -> list[ChoiceResult]:
    async def one(run: ChoiceRun) -> ChoiceResult:
        result = ChoiceResult(run.index)
        parts: list[str] = []
        async for delta in run.deltas():
            parts.append(delta.text)
            result.logprobs.extend(delta.logprobs)
            if delta.prompt is not None:
                result.prompt = delta.prompt
            if delta.finish_reason is not None:
                result.finish_reason, result.stop_reason = delta.finish_reason, delta.stop_reason
        result.text = "".join(parts)
        return result

    return await _all(one(run) for run in runs)


async def _merged(runs: list[ChoiceRun]) -> AsyncGenerator[ChoiceDelta, None]:
    """Every run's deltas, interleaved as they arrive."""
    if len(runs) == 1:
        async for delta in runs[0].deltas():
            yield delta
        return
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def pump(run: ChoiceRun) -> None:
        try:
            async for delta in run.deltas():
                queue.put_nowait(delta)
        except Exception as exc:
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(_END)

    tasks = [asyncio.ensure_future(pump(run)) for run in runs]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is _END:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)


async def _event_stream(runs: list[ChoiceRun], renderer: Renderer, n: int,
                        include_usage: bool) -> AsyncGenerator[str, None]:
    try:
        for run in runs:
            opening = renderer.opening(run.index)
            if opening is not None:
                yield sse(opening)
        deltas = _merged(runs)
        try:
            async for delta in deltas:
                chunk = renderer.chunk(delta)
                if chunk is not None:
                    yield sse(chunk)
        finally:
            await deltas.aclose()
        if include_usage:
            yield sse(renderer.usage_chunk(usage(runs, n)))
    except APIError as err:
        yield sse(err.body())
    except Exception as exc:  # headers are sent: the stream is the only way to say it
        log.exception("stream failed")
        yield sse(APIError(500, f"internal server error: {exc!r}").body())
    finally:
        await _close_all(runs)
    yield DONE


async def _close_all(runs: list[ChoiceRun]) -> None:
    for run in runs:
        await run.aclose()
