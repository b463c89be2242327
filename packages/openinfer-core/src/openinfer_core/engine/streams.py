"""Per-request event queues: events produced on one thread (the engine loop, or the thread
reading the engine process's messages) delivered to the asyncio tasks that asked for them."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from openinfer_core.events import Error, TokenEvent, is_terminal
from openinfer_core.request import GenerateRequest


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[TokenEvent]


class EventStreams:
    """Thread-safe. Once `fail_all` has run, new requests end at once with its message."""

    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self.dead: str | None = None  # why the engine is gone, once it is

    async def run(self, request: GenerateRequest, submit: Callable[[GenerateRequest], None],
                  abort: Callable[[str], None]) -> AsyncIterator[TokenEvent]:
        """`EngineHandle.generate`: register the request's stream, `submit` it, yield its
        events up to the terminal one; leaving early calls `abort`."""
        rid = request.request_id
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            if rid in self._streams:
                raise ValueError(f"request id {rid!r} is already running")
            dead = self.dead
            if dead is None:
                self._streams[rid] = stream
        if dead is not None:
            yield Error(rid, dead)
            return
        try:
            submit(request)
        except BaseException:
            with self._lock:
                self._streams.pop(rid, None)
            raise
        finished = False
        try:
            while not finished:
                event = await stream.queue.get()
                finished = is_terminal(event)
                yield event
        finally:
            if not finished:
                with self._lock:
                    self._streams.pop(rid, None)
                abort(rid)

    def holds(self, request_id: str) -> bool:
        """Whether `request_id`'s stream is open here."""
        return request_id in self._streams

    def deliver(self, events: list[TokenEvent]) -> None:
        # One wake-up per event loop per call, not one per event: each call_soon_threadsafe
        # writes to the loop's self-pipe, and a step at batch 512 has 512 events.
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, TokenEvent]]] = {}
        with self._lock:
            for event in events:
                stream = self._streams.get(event.request_id)
                if stream is None:
                    continue
                if is_terminal(event):
                    del self._streams[event.request_id]
                by_loop.setdefault(stream.loop, []).append((stream, event))
        for loop, batch in by_loop.items():
            _call_soon(loop, _put_all, batch)

    def fail_all(self, message: str) -> None:
        """The engine is gone: every open stream ends with `Error(message)`, and so does every
        request submitted from now on."""
        with self._lock:
            if self.dead is None:
                self.dead = message
            streams, self._streams = self._streams, {}
        for rid, stream in streams.items():
            _call_soon(stream.loop, stream.queue.put_nowait, Error(rid, message))


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> None:
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening any more
        loop.call_soon_threadsafe(fn, *args)


def _put_all(batch: list[tuple[_Stream, TokenEvent]]) -> None:
    for stream, event in batch:
        stream.queue.put_nowait(event)
