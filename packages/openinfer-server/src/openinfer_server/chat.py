"""POST /v1/chat/completions: messages rendered with the model line's chat encoder, else the
checkpoint's chat template."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

import jinja2
from fastapi import APIRouter, Request
from starlette.responses import Response

from openinfer_core.errors import InvalidParameterError, TokenizerError, TooManyTokensError
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.chat_output import ChatParsing, ChoiceOutput, OutputPiece
from openinfer_server.choice import ChoiceDelta, PromptScores
from openinfer_server.errors import APIError
from openinfer_server.generation import ChoiceResult, respond
from openinfer_server.json_body import JSONBodyRoute
from openinfer_server.logprobs import TokenLogprob, TokenText, chat_logprobs, prompt_logprobs
from openinfer_server.prompt_limit import PromptLimit
from openinfer_server.prompts import MaxTokens, Prompt, text_prompt
from openinfer_server.protocol import ChatCompletionRequest
from openinfer_server.run_plan import RunPlan, build_runs
from openinfer_server.state import ServerState, StateDep
from openinfer_server.structured import chat_structured_output

router = APIRouter(route_class=JSONBodyRoute)

# Set by the server itself; a client passing them in chat_template_kwargs would clash.
_RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "add_generation_prompt", "tools"})


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request,
                                 state: StateDep) -> Response:
    state.check_model(body.model)
    state.check_serving()
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    plan = await chat_plan(body, state)
    try:
        prompt = await state.threads.run_for(request, chat_prompt, body, state.tokenizer,
                                             state.prompt_limit)
    except TooManyTokensError as e:
        plan.max_tokens.refuse(e.count, state.max_model_len)
    state.metrics.intake(request)
    runs = build_runs(state, request_id, [prompt], plan)
    names = TokenText(state.tokenizer, as_ids=body.return_tokens_as_token_ids)
    renderer = ChatRenderer(request_id, state.model_name, names, logprobs=body.logprobs,
                            prompt_logprobs=plan.prompt_scores,
                            parsing=state.parsers.for_request(
                                body.tools, body.tool_choice, prompt.text,
                                parallel_tool_calls=body.parallel_tool_calls is not False,
                                call_format=body.call_format))
    return await respond(request, runs, renderer, n=plan.n, stream=body.stream,
                         include_usage=body.include_usage, shutdown=state.shutdown)


async def chat_plan(body: ChatCompletionRequest, state: ServerState) -> RunPlan:
    """The request's engine runs, checked; its prompt logprobs are reported once, so only the
    first choice asks for them. Unrequested, max tokens is the server's default (from
    generation_config.json), else the rest of the context."""
    param, requested = body.max_tokens_field
    max_tokens = MaxTokens(requested, state.sampling_defaults.get("max_tokens"), param=param,
                           where="messages")
    sampling = body.sampling_params(max_tokens.ceiling(state.max_model_len),
                                    body.logprobs_count, state.tokenizer.vocab_size,
                                    logprobs_field="top_logprobs",
                                    defaults=state.sampling_defaults)
    sampling = replace(sampling, structured=await chat_structured_output(body),
                       prompt_logprobs=body.prompt_logprobs)
    return RunPlan(sampling, max_tokens, n=body.n, priority=body.priority,
                   prompt_scores=body.prompt_logprobs is not None, scores_once=True)


def chat_prompt(body: ChatCompletionRequest, tokenizer: Tokenizer,
                limit: PromptLimit) -> Prompt:
    """The conversation rendered and tokenized, within `limit` (`prompts.text_prompt`).
    Renders and tokenizes: a large request's on a worker thread (`TokenizerThreads.run_for`)."""
    kwargs = dict(body.chat_template_kwargs or {})
    clash = _RESERVED_TEMPLATE_KWARGS & kwargs.keys()
    if clash:
        raise InvalidParameterError(
            "chat_template_kwargs", f"must not set {', '.join(sorted(clash))}; use the "
            "request fields instead")
    if body.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", body.reasoning_effort)
    if body.tools and body.tool_choice != "none":
        kwargs["tools"] = body.tools
    messages = [m.for_template() for m in body.messages]
    try:
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=body.add_generation_prompt, **kwargs)
    except InvalidParameterError:
        raise
    except TokenizerError as e:  # the model has no chat template
        raise APIError(400, str(e), param="messages") from e
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError,
            IndexError) as e:
        if tokenizer.chat_encoder is not None:
            raise  # an encoder names the request's mistakes itself: anything else is its bug
        # Templates index and compare message fields freely; odd shapes surface as these.
        raise InvalidParameterError(
            "messages", f"the model's chat template cannot format these messages: {e!r}"
        ) from e
    if not text:
        raise InvalidParameterError("messages", "the rendered conversation is empty")
    # The template placed every special token already; do not add a BOS again.
    return text_prompt(text, tokenizer, add_special_tokens=False, limit=limit, where="messages")


class ChatRenderer:
    """`chat.completion` objects and `chat.completion.chunk` deltas. With `parsing` active
    (tools in play or a reasoning parser on), each choice's text goes through its parsers into
    `reasoning_content`, `content` and `tool_calls`; the streamed deltas of a choice add up to
    its non-streamed message, and the opening chunk then leaves `content` out (it may be null).

    vLLM's `prompt_logprobs` are one list for the request (its choices share the prompt): a
    top-level field of the response, or of the first chunk that has them when streamed."""

    def __init__(self, request_id: str, model: str, names: TokenText, *,
                 logprobs: bool, prompt_logprobs: bool = False,
                 parsing: ChatParsing | None = None) -> None:
        self._created = int(time.time())
        self._id = request_id
        self._model = model
        self._names = names
        self._logprobs = logprobs
        self._parsing = parsing if parsing is not None and parsing.active else None
        self._outputs: dict[int, ChoiceOutput] = {}  # per streamed choice
        self._prompt_logprobs_due = prompt_logprobs  # not yet sent in a chunk

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self._id, "object": kind, "created": self._created, "model": self._model}

    def opening(self, index: int) -> dict[str, Any] | None:
        delta = {"role": "assistant"} if self._parsing else {"role": "assistant", "content": ""}
        return {**self._head("chat.completion.chunk"), "choices": [{
            "index": index, "delta": delta, "logprobs": None, "finish_reason": None}]}

    def chunk(self, delta: ChoiceDelta) -> dict[str, Any] | None:
        finish_reason = delta.finish_reason
        if self._parsing is None:
            fields: dict[str, Any] = {"content": delta.text} if delta.text else {}
        else:
            output = self._outputs.get(delta.index)
            if output is None:
                output = self._outputs[delta.index] = self._parsing.choice()
            piece = output.feed(delta.text) if delta.text else OutputPiece()
            if finish_reason is not None:
                piece.extend(output.finish())
                finish_reason = self._parsing.finish_reason(finish_reason, output.made_calls)
            fields = self._parsing.delta(piece)
        prompt = self._take_prompt_logprobs(delta.prompt)
        if not fields and not delta.logprobs and finish_reason is None and prompt is None:
            return None
        choice: dict[str, Any] = {
            "index": delta.index,
            "delta": fields,
            "logprobs": self._render_logprobs(delta.logprobs),
            "finish_reason": finish_reason,
        }
        if delta.finish_reason is not None:
            choice["stop_reason"] = delta.stop_reason
        out = {**self._head("chat.completion.chunk"), "choices": [choice]}
        if prompt is not None:
            out["prompt_logprobs"] = prompt
        return out

    def _take_prompt_logprobs(self, scores: PromptScores | None) -> list[Any] | None:
        if scores is None or not self._prompt_logprobs_due:
            return None
        self._prompt_logprobs_due = False
        return prompt_logprobs(scores.token_ids, scores.event, self._names)

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {**self._head("chat.completion.chunk"), "choices": [], "usage": usage}

    def response(self, choices: list[ChoiceResult], usage: dict[str, Any]) -> dict[str, Any]:
        ordered = sorted(choices, key=lambda c: c.index)
        out = {**self._head("chat.completion"), "choices": [self._choice(c) for c in ordered],
               "usage": usage}
        scored = next((c.prompt for c in ordered if c.prompt is not None), None)
        if scored is not None:
            out["prompt_logprobs"] = self._take_prompt_logprobs(scored)
        return out

    def _choice(self, c: ChoiceResult) -> dict[str, Any]:
        finish_reason = c.finish_reason
        if self._parsing is None:
            message: dict[str, Any] = {"role": "assistant", "content": c.text, "refusal": None}
        else:
            message, made_calls = self._parsing.message(c.text)
            if finish_reason is not None:
                finish_reason = self._parsing.finish_reason(finish_reason, made_calls)
        return {"index": c.index, "message": message,
                "logprobs": self._render_logprobs(c.logprobs),
                "finish_reason": finish_reason, "stop_reason": c.stop_reason}

    def _render_logprobs(self, entries: list[TokenLogprob]) -> dict[str, Any] | None:
        return chat_logprobs(entries, self._names) if self._logprobs else None
