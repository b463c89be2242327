"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, for every
failure a client can cause (and the few it cannot)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from openinfer_core.errors import InvalidParameterError

log = logging.getLogger("openinfer.server")

# OpenAI's error types by status; clients branch on the status, people read the type.
_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """A request failed in a way the client should hear about, with this status."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.headers = dict(headers or {})  # e.g. a 503's Retry-After

    @classmethod
    def invalid(cls, err: InvalidParameterError) -> APIError:
        return cls(400, str(err), param=err.param)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, type: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def install_error_handlers(app: FastAPI) -> None:
    """Route every error FastAPI or Starlette would answer in their own shape through ours;
    schema violations become 400 (OpenAI's status), not FastAPI's 422."""

    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return exc.response()

    async def on_invalid_parameter(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InvalidParameterError)
        return APIError.invalid(exc).response()

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError | ValidationError)
        return validation_error(exc).response()

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        err = APIError(exc.status_code, str(exc.detail))
        return JSONResponse(err.body(), status_code=exc.status_code, headers=exc.headers)

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error while serving a request", exc_info=exc)
        return APIError(500, f"internal server error: {exc!r}").response()

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(InvalidParameterError, on_invalid_parameter)
    app.add_exception_handler(RequestValidationError, on_validation)
    # A body a handler validates again in another shape (/tokenize's chat form).
    app.add_exception_handler(ValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)


def validation_error(exc: RequestValidationError | ValidationError) -> APIError:
    """One 400 naming the first offending field, listing every problem pydantic found."""
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        first = next(e for e in errors if e.get("type") == "json_invalid")
        detail = first.get("ctx", {}).get("error", first.get("msg", ""))
        return APIError(400, f"the request body is not valid JSON: {detail}", code="json_invalid")
    # A check on the whole body (protocol.py's) names the field it found in its context.
    params = [e.get("ctx", {}).get("param") or _field_path(e.get("loc", ())) for e in errors]
    lines = [f"{p or 'body'}: {e.get('msg', 'invalid')}"
             for p, e in zip(params, errors, strict=True)]
    # pydantic reports each member of a union separately; a handful of lines is enough.
    shown = "; ".join(dict.fromkeys(lines[:8]))
    more = f" (and {len(lines) - 8} more)" if len(lines) > 8 else ""
    param = next((p.split(".")[0].split("[")[0] for p in params if p), None)
    return APIError(400, f"invalid request: {shown}{more}", param=param)


def _field_path(loc: Any) -> str:
    """'messages[0].content' from pydantic's ('body', 'messages', 0, 'content', ...)."""
    parts = list(loc)[1:] if loc and loc[0] == "body" else list(loc)
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and not _is_type_tag(part):
            out += f".{part}" if out else part
    return out


def _is_type_tag(part: str) -> bool:
    """pydantic tags each union member's errors with its type ('str', 'list[int]',
    'function-after[...]'); those name types, not fields."""
    return part in _TYPE_NAMES or any(c in part for c in "[(-")


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "dict", "list", "none", "bytes"})
