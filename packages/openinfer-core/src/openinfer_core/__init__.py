"""openinfer-core: the engine contract, plugins, engine loop, sampler, text and weights.

Names are imported on first use, so loading plugins (which imports this package) never pulls
in torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "openinfer_core.llm",
    "Engine": "openinfer_core.engine.engine",
    "EngineConfig": "openinfer_core.engine.config",
    "AsyncEngine": "openinfer_core.engine.async_engine",
    "SamplingParams": "openinfer_core.params",
    "StructuredOutput": "openinfer_core.params",
    "GenerateRequest": "openinfer_core.request",
    "EngineHandle": "openinfer_core.handle",
    "ModelInfo": "openinfer_core.handle",
    "LoadSnapshot": "openinfer_core.handle",
    "FinishReason": "openinfer_core.events",
    "Scheduled": "openinfer_core.events",
    "Token": "openinfer_core.events",
    "PromptLogprobs": "openinfer_core.events",
    "Finished": "openinfer_core.events",
    "Error": "openinfer_core.events",
    "Rejected": "openinfer_core.events",
    "TokenEvent": "openinfer_core.events",
    "RequestOutput": "openinfer_core.outputs",
    "CompletionOutput": "openinfer_core.outputs",
    "hookimpl": "openinfer_core.hookspecs",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from openinfer_core.engine.async_engine import AsyncEngine
    from openinfer_core.engine.config import EngineConfig
    from openinfer_core.engine.engine import Engine
    from openinfer_core.events import (
        Error,
        Finished,
        FinishReason,
        PromptLogprobs,
        Rejected,
        Scheduled,
        Token,
        TokenEvent,
    )
    from openinfer_core.handle import EngineHandle, LoadSnapshot, ModelInfo
    from openinfer_core.hookspecs import hookimpl
    from openinfer_core.llm import LLM
    from openinfer_core.outputs import CompletionOutput, RequestOutput
    from openinfer_core.params import SamplingParams, StructuredOutput
    from openinfer_core.request import GenerateRequest


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'openinfer_core' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
