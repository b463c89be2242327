"""A streamed response: OpenAI's server-sent events (`event: TYPE`, then the JSON with `type`
and `sequence_number`), from `response.created` to `response.completed`, as openai-python's
`client.responses.stream` reads them. Like OpenAI's (and vLLM's), the stream ends without a
`[DONE]` line."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

from openinfer_server.chat_output import ChatParsing, OutputPiece
from openinfer_server.choice import ChoiceRun
from openinfer_server.errors import APIError
from openinfer_server.response_object import ResponseDraft
from openinfer_server.responses_output import OutputBuilder, status
from openinfer_server.streaming import sse

log = logging.getLogger("openinfer.server")


class _Sequence:
    """Numbers the events of one stream and writes them as SSE."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self, event: dict[str, Any]) -> str:
        kind = event["type"]
        payload = {"type": kind, "sequence_number": self._next, **event}
        self._next += 1
        return f"event: {kind}\n{sse(payload)}"


async def response_events(draft: ResponseDraft, run: ChoiceRun,
                          parsing: ChatParsing) -> AsyncGenerator[str, None]:
    """The events of `run` (started), its text through `parsing`'s parsers; the finished
    response is stored as the non-streamed one would be. An engine failure midway ends the
    stream with an `error` event. Closes `run` whatever happens."""
    send = _Sequence()
    start = draft.object("in_progress", [])
    yield send({"type": "response.created", "response": start})
    yield send({"type": "response.in_progress", "response": start})
    output = parsing.choice()
    builder = OutputBuilder()
    try:
        finish_reason = None
        async for delta in run.deltas():
            piece = output.feed(delta.text) if delta.text else OutputPiece()
            if delta.finish_reason is not None:
                piece.extend(output.finish())
                finish_reason = delta.finish_reason
            for event in builder.feed(piece):
                yield send(event)
        for event in builder.finish(status(finish_reason)[0]):
            yield send(event)
        response = draft.finish(builder, run, finish_reason)
        yield send({"type": "response.completed", "response": response})
    except APIError as err:
        yield send(_error(err))
    except Exception as exc:  # headers are sent: the stream is the only way to say it
        log.exception("stream failed")
        yield send(_error(APIError(500, f"internal server error: {exc!r}")))
    finally:
        await run.aclose()


def _error(err: APIError) -> dict[str, Any]:
    """OpenAI's `error` stream event."""
    return {"type": "error", "code": err.code or err.type, "message": err.message,
            "param": err.param}
