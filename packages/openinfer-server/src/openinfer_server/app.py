"""The FastAPI application: OpenAI-compatible routes over an `EngineHandle`."""

from __future__ import annotations

import contextlib
import importlib.metadata
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import fastapi
from starlette.responses import Response

from openinfer_core.handle import EngineHandle
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server import chat, completions, embeddings, responses, tokenization
from openinfer_server.auth import APIKeyMiddleware
from openinfer_server.body_limit import DEFAULT_MAX_REQUEST_BYTES, BodyLimitMiddleware
from openinfer_server.chat_output import ChatParsers
from openinfer_server.errors import install_error_handlers
from openinfer_server.metrics import CONTENT_TYPE, ArrivalMiddleware, ServerMetrics
from openinfer_server.prompt_limit import PromptLimit
from openinfer_server.request_id import RequestIdMiddleware
from openinfer_server.state import ServerState, StateDep
from openinfer_server.tokenizer_threads import TokenizerThreads

DEMO_NOTE = ("openinfer's built-in demo model: a tiny model with random weights and its line's "
             "real tokenizer. Its output is meaningless; serve a real checkpoint for real text.")


def build_app(engine: EngineHandle, tokenizer: Tokenizer, *, served_model_names: list[str],
              api_key: str | None = None, metrics_without_auth: bool = False,
              max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, is_demo: bool = False,
              max_model_len: int | None = None,
              sampling_defaults: Mapping[str, Any] | None = None,
              parsers: ChatParsers | None = None) -> fastapi.FastAPI:
    """An app serving `engine`. The first served name is the one responses report; a request
    naming any model not in `served_model_names` gets 404. With `api_key`, every route but
    /health needs `Authorization: Bearer <api_key>` (/metrics too, unless
    `metrics_without_auth`). A body over `max_request_bytes` gets 413. `sampling_defaults`
    fill the sampling fields a request leaves out (see `openinfer_core.generation_config`).
    `parsers`: the tool-call and reasoning parsers chat responses go through (default: none)."""
    if not served_model_names:
        raise ValueError("served_model_names must name at least one model")
    limit = max_model_len if max_model_len is not None else engine.model_info.max_model_len
    if limit > engine.model_info.max_model_len:
        raise ValueError(f"max_model_len={limit} exceeds the engine's "
                         f"{engine.model_info.max_model_len}")
    threads = TokenizerThreads()

    @contextlib.asynccontextmanager
    async def lifespan(_: fastapi.FastAPI) -> AsyncIterator[None]:
        yield
        threads.close()

    app = fastapi.FastAPI(title="openinfer", version=_version(), lifespan=lifespan,
                          summary="OpenAI-compatible LLM inference server")
    app.state.openinfer = ServerState(
        engine=engine, tokenizer=tokenizer, served_model_names=tuple(served_model_names),
        max_model_len=limit, metrics=ServerMetrics(engine, served_model_names[0]),
        prompt_limit=PromptLimit.for_model(limit, tokenizer), threads=threads,
        is_demo=is_demo, sampling_defaults=dict(sampling_defaults or {}),
        parsers=parsers or ChatParsers())
    install_error_handlers(app)
    # Added innermost first: a request is stamped, identified, authenticated, then measured.
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_bytes)
    if api_key is not None:
        app.add_middleware(APIKeyMiddleware, api_key=api_key,
                           metrics_without_auth=metrics_without_auth)
    app.add_middleware(RequestIdMiddleware)  # outermost but one, so 401s get one too
    app.add_middleware(ArrivalMiddleware)  # outermost: the intake clock starts first
    # An engine serves one task: generation routes are a 400 on an embedding engine.
    generate_only = [fastapi.Depends(embeddings.requires_generate)]
    app.include_router(completions.router, dependencies=generate_only)
    app.include_router(chat.router, dependencies=generate_only)
    app.include_router(responses.router, dependencies=generate_only)
    app.include_router(embeddings.router)
    app.include_router(tokenization.router)
    _add_info_routes(app)
    return app


def _add_info_routes(app: fastapi.FastAPI) -> None:
    created = int(time.time())

    @app.get("/v1/models")
    async def list_models(state: StateDep) -> dict[str, Any]:
        return {"object": "list", "data": [
            _model_card(name, state, created) for name in state.served_model_names]}

    # `:path`: served names may hold slashes (Qwen/Qwen3-8B).
    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str, state: StateDep) -> dict[str, Any]:
        state.check_model(model_id)
        return _model_card(model_id, state, created)

    @app.get("/health")
    async def health(state: StateDep) -> Response:
        unavailable = state.unavailable()  # the engine died, or shutdown began
        return Response(status_code=200) if unavailable is None else unavailable.response()

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": _version()}

    @app.get("/metrics")
    async def metrics(state: StateDep) -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)


def _model_card(name: str, state: ServerState, created: int) -> dict[str, Any]:
    card: dict[str, Any] = {
        "id": name, "object": "model", "created": created,
        "owned_by": "openinfer-demo" if state.is_demo else "openinfer",
        "root": state.engine.model_info.name, "parent": None,
        "max_model_len": state.max_model_len, "permission": [],
    }
    if state.is_demo:
        card["root"] = "openinfer-demo (random weights)"
        card["metadata"] = {"demo": True, "description": DEMO_NOTE}
    return card


def _version() -> str:
    try:
        return importlib.metadata.version("openinfer-server")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
