"""When the server cannot serve: its engine died, or it is shutting down. Both are a 503 with
`Retry-After`, in OpenAI's error shape, so that clients (openai-python retries a 503 after the
time `Retry-After` gives) and load balancers try again, here once restarted or elsewhere.

Shutdown, as requests see it: `begin()` (SIGTERM) refuses new requests while those in
flight go on; `end()` (the `--shutdown-timeout` deadline) ends every response still open at
once, a stream with an error event and `[DONE]`, a non-streamed request with a 503, and
aborts their engine requests so that their KV blocks are freed."""

from __future__ import annotations

import asyncio

from openinfer_server.errors import APIError

# Seconds a client should wait before it tries again: a restarted server or another replica
# behind the same balancer is likely there by then, and openai-python honours up to 60.
RETRY_AFTER_S = 5

SHUTTING_DOWN = "server shutting down"


def engine_dead(reason: str) -> APIError:
    return APIError(503, f"the engine is not serving: {reason}", code="engine_dead",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


def shutting_down() -> APIError:
    return APIError(503, SHUTTING_DOWN, code="server_shutting_down",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


class Shutdown:
    """The frontend's shutdown. Event loop only: `end()` must run on the loop whose requests
    wait in `ended()`."""

    def __init__(self) -> None:
        self.begun = False  # SIGTERM came: new requests get a 503
        self.over = False  # the deadline passed: open responses end now
        self._waiters: set[asyncio.Future[None]] = set()

    @property
    def open_responses(self) -> int:
        """Responses waiting in `ended()`: those `end()` would cut short now."""
        return len(self._waiters)

    def begin(self) -> None:
        self.begun = True

    def end(self) -> None:
        self.begun = self.over = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def ended(self) -> None:
        """Return once `end()` has run. A future per waiter rather than one asyncio.Event,
        so an app can be served by one event loop after another (as tests do)."""
        if self.over:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await waiter
        finally:
            self._waiters.discard(waiter)
