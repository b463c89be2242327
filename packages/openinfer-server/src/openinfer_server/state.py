"""What every handler of one app shares: the engine, the tokenizer, its threads and the served
names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request

from openinfer_core.handle import EngineHandle
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.availability import Shutdown, engine_dead, shutting_down
from openinfer_server.chat_output import ChatParsers
from openinfer_server.errors import APIError
from openinfer_server.metrics import ServerMetrics
from openinfer_server.prompt_limit import PromptLimit
from openinfer_server.response_store import ResponseStore
from openinfer_server.tokenizer_threads import TokenizerThreads


@dataclass(frozen=True, slots=True)
class ServerState:
    engine: EngineHandle
    tokenizer: Tokenizer
    served_model_names: tuple[str, ...]
    max_model_len: int
    metrics: ServerMetrics
    # How long a prompt may be, in tokens and (checked before tokenizing) in characters.
    prompt_limit: PromptLimit
    # Where prompts are tokenized and chat templates rendered: off the event loop.
    threads: TokenizerThreads
    is_demo: bool = False
    # What a request gets for a sampling field it leaves out (--generation-config auto): the
    # checkpoint's generation_config.json values, keyed by SamplingParams field name.
    sampling_defaults: Mapping[str, Any] = field(default_factory=dict)
    # --tool-call-parser / --reasoning-parser, resolved (chat_output.py applies them).
    parsers: ChatParsers = field(default_factory=ChatParsers)
    # Begun and ended by the frontend process on SIGTERM (frontend.py).
    shutdown: Shutdown = field(default_factory=Shutdown)
    # Stored Responses API responses (store: true), this frontend process's own.
    responses: ResponseStore = field(default_factory=ResponseStore)

    @property
    def model_name(self) -> str:
        """The name responses report (the first served name)."""
        return self.served_model_names[0]

    def check_model(self, model: str | None) -> None:
        """404 unless `model` is one of our names; an omitted model means ours."""
        if model is not None and model not in self.served_model_names:
            raise APIError(
                404, f"The model `{model}` does not exist. This server serves "
                f"{', '.join(repr(n) for n in self.served_model_names)}.",
                param="model", code="model_not_found")


    def unavailable(self) -> APIError | None:
        """The 503 (with Retry-After) for any request that needs the engine, from the moment
        the engine is found dead or shutdown begins until the process exits; None while
        serving."""
        dead = self.engine.dead
        if dead is not None:
            return engine_dead(dead)
        return shutting_down() if self.shutdown.begun else None

    def check_serving(self) -> None:
        """Raise `unavailable()`'s 503, if any."""
        error = self.unavailable()
        if error is not None:
            raise error


async def get_state(request: Request) -> ServerState:
    """FastAPI dependency: this app's state. A coroutine, so that FastAPI calls it on the
    event loop: a plain function it would hand to a worker thread for every request."""
    state: ServerState = request.app.state.openinfer
    return state


StateDep = Annotated[ServerState, Depends(get_state)]
