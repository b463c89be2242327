"""Request bodies parsed by pydantic-core's JSON parser rather than the json module's. Parsing
holds the event loop (and the GIL) either way; for a long prompt pydantic-core takes a tenth of
the time (3 ms against 30 for a 20 MB string), which keeps /health answering meanwhile."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response


class JSONBodyRoute(APIRoute):
    """An APIRoute whose JSON body is parsed by `pydantic_core.from_json`. What it cannot
    parse (other encodings than UTF-8, a byte-order mark, a lone surrogate, deep nesting, no
    JSON at all) is left to FastAPI, which parses it again as always and words the error; what
    it parses it reads as `json.loads` does."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parse_then_handle(request: Request) -> Response:
            body = await request.body()
            if body:
                with contextlib.suppress(ValueError):
                    # Starlette's cache of the parsed body, which FastAPI reads next.
                    request._json = pydantic_core.from_json(body)
            return await handler(request)

        return parse_then_handle
