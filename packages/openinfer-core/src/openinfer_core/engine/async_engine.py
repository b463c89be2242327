"""`EngineHandle` in process: the engine loop on its own thread, events delivered to asyncio.
For `LLM`-style embedding and tests; `openinfer serve` runs the engine in its own process
(`openinfer_core.ipc`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator

from openinfer_core.engine.engine import Engine
from openinfer_core.engine.streams import EventStreams
from openinfer_core.events import TokenEvent
from openinfer_core.handle import LoadSnapshot, ModelInfo
from openinfer_core.request import GenerateRequest

log = logging.getLogger("openinfer")


class AsyncEngine:
    """Runs `engine.step()` on a dedicated thread while there is work, sleeping otherwise.
    Implements `openinfer_core.handle.EngineHandle`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._streams = EventStreams()
        self._wake = threading.Event()
        self._stopped = False
        self._snapshot = engine.snapshot()
        self._thread = threading.Thread(target=self._run, name="openinfer-engine", daemon=True)
        self._thread.start()

    @property
    def model_info(self) -> ModelInfo:
        return self.engine.model_info

    @property
    def dead(self) -> str | None:
        return self._streams.dead

    def load(self) -> LoadSnapshot:
        return self._snapshot

    def generate(self, request: GenerateRequest) -> AsyncIterator[TokenEvent]:
        return self._streams.run(request, self._submit, self.abort)

    def _submit(self, request: GenerateRequest) -> None:
        self.engine.add_request(request)
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._wake.set()

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self.engine.close()

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
                self._streams.fail_all(f"engine loop crashed: {exc!r}")
                return
            self._snapshot = self.engine.snapshot()
            self._streams.deliver(events)
