"""POST /v1/completions: text in, text out, OpenAI's legacy completions format."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from openinfer_core.errors import TooManyTokensError
from openinfer_server.choice import ChoiceDelta, PromptScores
from openinfer_server.generation import ChoiceResult, respond
from openinfer_server.json_body import JSONBodyRoute
from openinfer_server.logprobs import (
    TokenLogprob,
    TokenText,
    completion_logprobs,
    prompt_logprobs,
)
from openinfer_server.prompts import MaxTokens, completion_prompts
from openinfer_server.protocol import CompletionRequest
from openinfer_server.run_plan import RunPlan, build_runs, echo_texts
from openinfer_server.state import ServerState, StateDep
from openinfer_server.structured import structured_output

router = APIRouter(route_class=JSONBodyRoute)

# OpenAI's default for the legacy completions endpoint.
DEFAULT_MAX_TOKENS = 16


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request,
                            state: StateDep) -> Response:
    state.check_model(body.model)
    state.check_serving()
    request_id = f"cmpl-{uuid.uuid4().hex}"
    plan = await completion_plan(body, state)
    try:
        prompts = await state.threads.run_for(
            request, completion_prompts, body.prompt, state.tokenizer,
            add_special_tokens=body.add_special_tokens, limit=state.prompt_limit)
    except TooManyTokensError as e:
        plan.max_tokens.refuse(e.count, state.max_model_len)
    echoes = await state.threads.run(echo_texts, prompts, state, plan) if plan.echo else None
    state.metrics.intake(request)
    runs = build_runs(state, request_id, prompts, plan, echoes)
    names = TokenText(state.tokenizer, as_ids=body.return_tokens_as_token_ids)
    renderer = CompletionRenderer(request_id, state.model_name, names,
                                  logprobs=body.logprobs is not None)
    return await respond(request, runs, renderer, n=plan.n, stream=body.stream,
                         include_usage=body.include_usage, shutdown=state.shutdown)


async def completion_plan(body: CompletionRequest, state: ServerState) -> RunPlan:
    """The request's engine runs, checked. Echo with logprobs asks the engine for the
    prompt's logprobs too; max_tokens 0 with echo scores the prompt only."""
    max_tokens = MaxTokens(body.max_tokens, DEFAULT_MAX_TOKENS, param="max_tokens",
                           where="prompt")
    sampling = body.sampling_params(max_tokens.ceiling(state.max_model_len), body.logprobs,
                                    state.tokenizer.vocab_size,
                                    defaults=state.sampling_defaults)
    sampling = replace(sampling, structured=await structured_output(body),
                       prompt_logprobs=body.prompt_logprobs_count)
    return RunPlan(sampling, max_tokens, n=body.n, priority=body.priority, echo=body.echo,
                   prompt_scores=body.prompt_logprobs is not None)


class CompletionRenderer:
    """`text_completion` objects, streamed or whole."""

    def __init__(self, request_id: str, model: str, names: TokenText, *,
                 logprobs: bool) -> None:
        self._head = {"id": request_id, "object": "text_completion",
                      "created": int(time.time()), "model": model}
        self._names = names
        self._logprobs = logprobs

    def opening(self, index: int) -> dict[str, Any] | None:
        return None

    def chunk(self, delta: ChoiceDelta) -> dict[str, Any] | None:
        if not delta.text and not delta.logprobs and delta.finish_reason is None \
                and delta.prompt is None:
            return None
        return {**self._head, "choices": [self._choice(
            delta.index, delta.text, delta.logprobs, delta.finish_reason, delta.stop_reason,
            delta.prompt)]}

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {**self._head, "choices": [], "usage": usage}

    def response(self, choices: list[ChoiceResult], usage: dict[str, Any]) -> dict[str, Any]:
        return {**self._head, "choices": [
            self._choice(c.index, c.text, c.logprobs, c.finish_reason, c.stop_reason, c.prompt)
            for c in sorted(choices, key=lambda c: c.index)
        ], "usage": usage}

    def _choice(self, index: int, text: str, logprobs: list[TokenLogprob],
                finish_reason: str | None, stop_reason: int | str | None,
                prompt: PromptScores | None) -> dict[str, Any]:
        choice = {
            "index": index,
            "text": text,
            "logprobs": completion_logprobs(logprobs, self._names) if self._logprobs else None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }
        if prompt is not None:
            choice["prompt_logprobs"] = prompt_logprobs(prompt.token_ids, prompt.event,
                                                        self._names)
        return choice
