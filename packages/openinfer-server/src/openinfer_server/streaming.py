"""Server-sent events, and noticing that the client went away or the server is shutting down.

Starlette's StreamingResponse notices a disconnect only on some servers and leaves the body
generator suspended rather than closed; here the generator is always closed (so its engine
requests are aborted and their KV freed) whether the stream ends, fails, or the client leaves,
even while no token is flowing. At the shutdown deadline the same happens, and the client
hears why: an error event and [DONE] on a stream, a 503 otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import msgspec
from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from openinfer_server.availability import Shutdown, shutting_down

T = TypeVar("T")

DONE = "data: [DONE]\n\n"


def sse(payload: Mapping[str, Any]) -> str:
    # msgspec, not json: one of these per streamed token, and json.dumps takes ~8% of a
    # frontend's time at 10,000 tokens/s. Compact, UTF-8, keys in order, as json.dumps with
    # separators=(",", ":") and ensure_ascii=False (but a non-finite float is null, not the
    # -Infinity that strict JSON parsers refuse).
    return f"data: {_ENCODER.encode(payload).decode()}\n\n"


_ENCODER = msgspec.json.Encoder()


class ClientGone(Exception):
    """The client disconnected before its response was ready."""


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(request: Request, work: Awaitable[T], *,
                             shutdown: Shutdown) -> T:
    """Await `work`, cancelling it if the client disconnects first (raising ClientGone) or
    the shutdown deadline passes first (raising the 503 of `shutting_down()`)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_wait_for_disconnect(request.receive))
    over = asyncio.ensure_future(shutdown.ended())
    try:
        await asyncio.wait({task, gone, over}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in (gone, over):
            waiter.cancel()
        if not task.done():
            task.cancel()
        await asyncio.wait({task, gone, over})
    if task.cancelled():
        raise ClientGone if over.cancelled() else shutting_down()
    return task.result()


class EventStreamResponse(Response):
    """`text/event-stream` from an async generator of already formatted SSE strings,
    ending with `[DONE]`. A stream still open when `shutdown` ends is cut short: an error
    event ("server shutting down") and `[DONE]` end its body (a 503, if nothing was sent)."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncGenerator[str, None], *,
                 on_close: Callable[[], Awaitable[None]] | None = None,
                 shutdown: Shutdown, status_code: int = 200) -> None:
        self._chunks = chunks
        self._on_close = on_close
        self._shutdown = shutdown
        self._started = False  # the status line and headers are sent
        self._said_all = False  # every chunk is sent, [DONE] included
        self.status_code = status_code
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender = asyncio.ensure_future(self._send_all(send))
        gone = asyncio.ensure_future(_wait_for_disconnect(receive))
        over = asyncio.ensure_future(self._shutdown.ended())
        try:
            await asyncio.wait({sender, gone, over}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sender, gone, over):
                task.cancel()
            await asyncio.wait({sender, gone, over})
            # Only now is the generator not running, so it can be closed.
            await self._chunks.aclose()
            if self._on_close is not None:
                await self._on_close()
        if sender.cancelled():
            if not over.cancelled():
                await self._cut_short(scope, receive, send)
        elif sender.exception() is not None:
            raise sender.exception()  # type: ignore[misc]

    async def _cut_short(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = shutting_down()
        if not self._started:
            await error.response()(scope, receive, send)
            return
        body = "" if self._said_all else sse(error.body()) + DONE
        await send({"type": "http.response.body", "body": body.encode("utf-8"),
                    "more_body": False})

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        self._started = True
        async for chunk in self._chunks:
            await send({"type": "http.response.body", "body": chunk.encode("utf-8"),
                        "more_body": True})
        self._said_all = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
