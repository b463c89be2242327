"""--api-key covers every route the app registers but /health, found from the app's own route
table so that a new route cannot slip through; --metrics-without-auth opens /metrics alone."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import tokenizers
from fastapi import FastAPI
from live_server import API_KEY, MODEL, LiveServer, error_of
from starlette.routing import Route

from openinfer_core.handle import EngineHandle, LoadSnapshot, ModelInfo
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.app import build_app

GOOD = {"Authorization": f"Bearer {API_KEY}"}
WRONG = [{"Authorization": "Bearer sk-wrong"}, {"Authorization": API_KEY},
         {"Authorization": f"Bearer {API_KEY}x"}, {"Authorization": f"Bearer {API_KEY[:-1]}"}]


def _route_table(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path) the app answers, those of included routers too; checked against
    the OpenAPI schema, so that a router this walk cannot read fails here."""
    found: set[tuple[str, str]] = set()

    def walk(routes: list[Any], prefix: str) -> None:
        for route in routes:
            if isinstance(route, Route):
                found.update((m, prefix + route.path_format) for m in route.methods or ())
            else:  # FastAPI's `include_router` entry
                walk(route.original_router.routes, prefix + route.include_context.prefix)

    walk(app.routes, "")
    documented = {(m.upper(), path) for path, ops in app.openapi()["paths"].items()
                  for m in ops}
    assert documented <= found, documented - found
    return sorted(found)


def _collected_app() -> FastAPI:
    """The app as build_app makes it, over stand-ins: only its routes are read."""
    info = ModelInfo("stand-in", 64, 8, 16, ())
    word_level = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, "[UNK]"))
    load = LoadSnapshot(running=0, waiting=0, kv_used_blocks=0, kv_total_blocks=8)
    engine: Any = SimpleNamespace(model_info=info, load=lambda: load)
    return build_app(engine, Tokenizer(word_level), served_model_names=[MODEL], api_key="k")


ROUTES = _route_table(_collected_app())


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", MODEL, path)


def test_the_collected_routes_are_the_live_apps(keyed_server: LiveServer) -> None:
    assert _route_table(keyed_server.app) == ROUTES
    assert {path for _, path in ROUTES} >= {
        "/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize",
        "/metrics", "/version", "/docs", "/openapi.json", "/redoc", "/health"}


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_every_route_but_health_needs_the_key(keyed_server: LiveServer, method: str,
                                              path: str) -> None:
    url = f"{keyed_server.url}{_concrete(path)}"
    body = {"json": {}} if method == "POST" else {}
    if path == "/health":
        assert httpx.request(method, url).status_code == 200
        return
    for headers in [{}, *WRONG]:
        refused = httpx.request(method, url, headers=headers, **body)
        assert refused.status_code == 401, (headers, refused.text)
        assert refused.headers["www-authenticate"] == "Bearer"
        if method != "HEAD":
            err = error_of(refused, 401)
            assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
    allowed = httpx.request(method, url, headers=GOOD, **body)
    # With the key the route answers for itself: an empty POST body is the route's own 400,
    # a response id never stored the route's own 404.
    expected = 400 if method == "POST" else 404 if path.startswith("/v1/responses/") else 200
    assert allowed.status_code == expected, allowed.text


def test_an_unknown_route_is_401_without_the_key(keyed_server: LiveServer) -> None:
    url = f"{keyed_server.url}/v1/no-such-route"
    error_of(httpx.get(url), 401)
    error_of(httpx.get(url, headers=GOOD), 404)


async def _get(app: FastAPI, path: str, headers: dict[str, str] | None = None) -> int:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as c:
        return (await c.get(path, headers=headers)).status_code


def test_metrics_without_auth_opens_metrics_alone(engine: EngineHandle,
                                                  tokenizer: Tokenizer) -> None:
    opened = build_app(engine, tokenizer, served_model_names=[MODEL], api_key=API_KEY,
                       metrics_without_auth=True)
    assert asyncio.run(_get(opened, "/metrics")) == 200
    for path in ("/version", "/v1/models", "/docs", "/openapi.json"):
        assert asyncio.run(_get(opened, path)) == 401, path
        assert asyncio.run(_get(opened, path, GOOD)) == 200, path
    closed = build_app(engine, tokenizer, served_model_names=[MODEL], api_key=API_KEY)
    assert asyncio.run(_get(closed, "/metrics")) == 401
    assert asyncio.run(_get(closed, "/metrics", GOOD)) == 200
