"""openinfer-server: the OpenAI-compatible HTTP server and the `openinfer` command line.

`build_app` is imported on first use, so the command line starts without loading FastAPI."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["build_app"]

if TYPE_CHECKING:
    from openinfer_server.app import build_app


def __getattr__(name: str) -> Any:
    if name == "build_app":
        from openinfer_server.app import build_app

        return build_app
    raise AttributeError(f"module 'openinfer_server' has no attribute {name!r}")
