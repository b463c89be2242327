"""Bearer API keys on the OpenAI routes (/v1/...); /health, /metrics and /version stay open
so probes and scrapers need no secret."""

from __future__ import annotations

import json
import secrets

from starlette.types import ASGIApp, Receive, Scope, Send

from openinfer_server.errors import APIError


class APIKeyMiddleware:
    """Plain ASGI (not BaseHTTPMiddleware), so streaming and disconnects pass through
    untouched."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1"):
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if secrets.compare_digest(given, self._expected):
            await self.app(scope, receive, send)
            return
        what = "missing" if not given else "incorrect"
        err = APIError(401, f"API key {what}: send it as 'Authorization: Bearer <key>'",
                       code="invalid_api_key")
        body = json.dumps(err.body()).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
