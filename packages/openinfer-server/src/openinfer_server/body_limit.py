"""--max-request-bytes: a request body over the limit gets a 413 before it is parsed. A
declared Content-Length is checked before a byte of the body is read; a chunked body is
counted as it arrives and refused once it passes the limit."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `openinfer --help` reads the default below without importing the app
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

# vLLM's Rust frontend's limit: a 1M-token prompt as ids (~7 MiB) or as escaped text fits
# with room to spare, while a hostile body stays far from exhausting memory.
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024


class BodyLimitMiddleware:
    """Plain ASGI, so streamed responses and disconnects pass through untouched."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None:
            # The server reads exactly the declared length, so checking it is enough.
            if declared.isdigit() and int(declared) > self.max_bytes:
                await self._refuse(send, f" ({int(declared)} bytes)")
                return
            await self.app(scope, receive, send)
            return
        if b"chunked" not in headers.get(b"transfer-encoding", b"").lower():
            await self.app(scope, receive, send)  # no body
            return
        received = await self._read_body(receive)
        if received is None:
            await self._refuse(send, "")
            return
        await self.app(scope, _replay(received, receive), send)

    async def _read_body(self, receive: Receive) -> list[Message] | None:
        """The body's messages, or None once they pass the limit (the rest is not read)."""
        messages: list[Message] = []
        total = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages  # a disconnect: the app hears of it
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                return None
            if not message.get("more_body", False):
                return messages

    async def _refuse(self, send: Send, size: str) -> None:
        from openinfer_server.errors import APIError

        err = APIError(413, f"the request body{size} is larger than this server accepts "
                       f"({self.max_bytes} bytes, set by --max-request-bytes); send a shorter "
                       "request", code="request_too_large")
        body = json.dumps(err.body()).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that gives back the messages read already, then the connection's own."""
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay
