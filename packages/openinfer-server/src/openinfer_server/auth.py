"""--api-key: a bearer key on every route but /health (which probes need without a secret), and
/metrics too unless --metrics-without-auth opens it for a Prometheus scraper. Routes that do not
exist answer 401 as well, so a client without the key learns nothing about the routes."""

from __future__ import annotations

import hashlib
import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from openinfer_server.errors import APIError

OPEN_PATHS = frozenset({"/health"})
METRICS_PATH = "/metrics"


class APIKeyMiddleware:
    """Plain ASGI (not BaseHTTPMiddleware), so streaming and disconnects pass through
    untouched."""

    def __init__(self, app: ASGIApp, api_key: str, *, metrics_without_auth: bool = False) -> None:
        self.app = app
        self._expected = _digest(f"Bearer {api_key}".encode())
        self._open = OPEN_PATHS | ({METRICS_PATH} if metrics_without_auth else set())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._open:
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        # Digests of equal length, compared in constant time: neither the key's length nor
        # how much of it a guess got right shows in the time taken.
        if hmac.compare_digest(_digest(given), self._expected):
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


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()
