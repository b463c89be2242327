"""`EngineHandle` for servers: the engine loop on its own thread, events delivered to asyncio."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from openinfer_core.engine.engine import Engine
from openinfer_core.events import Error, TokenEvent, is_terminal
from openinfer_core.handle import LoadSnapshot, ModelInfo
from openinfer_core.request import GenerateRequest

log = logging.getLogger("openinfer")


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[TokenEvent]


class AsyncEngine:
    """Runs `engine.step()` on a dedicated thread while there is work, sleeping otherwise.
    Implements `openinfer_core.handle.EngineHandle`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._dead: str | None = None  # why the loop died, if it did
        self._snapshot = engine.snapshot()
        self._thread = threading.Thread(target=self._run, name="openinfer-engine", daemon=True)
        self._thread.start()

    @property
    def model_info(self) -> ModelInfo:
        return self.engine.model_info

    def load(self) -> LoadSnapshot:
        return self._snapshot

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenEvent]:
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            if request.request_id in self._streams:
                raise ValueError(f"request id {request.request_id!r} is already running")
            self._streams[request.request_id] = stream
            dead = self._dead
        if dead is not None:
            self._streams.pop(request.request_id, None)
            yield Error(request.request_id, dead)
            return
        self.engine.add_request(request)
        self._wake.set()
        finished = False
        try:
            while not finished:
                event = await stream.queue.get()
                finished = is_terminal(event)
                yield event
        finally:
            if not finished:
                self.abort(request.request_id)

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._wake.set()

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stopped:
            if not self.engine.has_work():
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                events = self.engine.step()
            except Exception as exc:  # a bug in the loop itself: fail loudly, never hang
                log.exception("engine loop crashed")
                self._die(f"engine loop crashed: {exc!r}")
                return
            self._snapshot = self.engine.snapshot()
            self._deliver(events)

    def _die(self, message: str) -> None:
        with self._lock:
            self._dead = message
            streams, self._streams = self._streams, {}
        for request_id, stream in streams.items():
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, Error(request_id, message))

    def _deliver(self, events: list[TokenEvent]) -> None:
        # One wake-up per event loop per step, not one per event: each call_soon_threadsafe
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
            loop.call_soon_threadsafe(_put_all, batch)


def _put_all(batch: list[tuple[_Stream, TokenEvent]]) -> None:
    for stream, event in batch:
        stream.queue.put_nowait(event)
