"""The `response` object of the Responses API: what it echoes of the request, its usage, and
storing it once finished."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openinfer_server.choice import ChoiceRun
from openinfer_server.response_store import ResponseStore, StoredResponse
from openinfer_server.responses_output import OutputBuilder, status
from openinfer_server.responses_protocol import ResponsesRequest


@dataclass(frozen=True, slots=True)
class ResponseDraft:
    """What a response object holds besides its output, known before generation starts.
    `store` is where the finished response goes (None: `store: false`)."""

    id: str
    created_at: int
    model: str
    body: ResponsesRequest
    echo_sampling: dict[str, Any]
    input_items: tuple[dict[str, Any], ...]
    store: ResponseStore | None

    def object(self, status: str, output: list[dict[str, Any]],
               usage: dict[str, Any] | None = None,
               incomplete_details: dict[str, Any] | None = None) -> dict[str, Any]:
        """The `response` object, with the request's settings echoed as OpenAI does."""
        body = self.body
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "background": False, "error": None,
            "incomplete_details": incomplete_details, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "max_tool_calls": None,
            "metadata": body.metadata or {}, "model": self.model, "output": output,
            "parallel_tool_calls": body.parallel_tool_calls,
            "previous_response_id": body.previous_response_id,
            "reasoning": body.reasoning or {"effort": None, "summary": None},
            "service_tier": "auto", "store": body.store,
            **self.echo_sampling,
            "text": body.text or {"format": {"type": "text"}},
            "tool_choice": body.tool_choice, "tools": [_echo_tool(t) for t in body.tools or []],
            "top_logprobs": 0, "truncation": "disabled", "usage": usage, "user": body.user,
        }

    def finish(self, builder: OutputBuilder, run: ChoiceRun,
               finish_reason: str | None) -> dict[str, Any]:
        """The finished response object, stored unless `store: false`."""
        state, details = status(finish_reason)
        response = self.object(state, builder.items, usage(run), details)
        if self.store is not None:
            self.store.put(StoredResponse(response, self.input_items))
        return response


def usage(run: ChoiceRun) -> dict[str, Any]:
    return {"input_tokens": run.prompt_tokens,
            "input_tokens_details": {"cached_tokens": run.cached_tokens},
            "output_tokens": run.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": run.prompt_tokens + run.completion_tokens}


def _echo_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "description": None, "parameters": None, "strict": None,
            **tool}
