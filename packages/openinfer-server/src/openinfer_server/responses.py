"""POST /v1/responses (OpenAI's Responses API), GET and DELETE /v1/responses/{id}.

A response runs as the chat completion its body translates into (responses_protocol.py):
the same plan, prompt, engine runs and output parsers as /v1/chat/completions; only the wire
format differs (responses_output.py, responses_stream.py). Finished responses are kept in the
frontend's `ResponseStore` unless `store` is false."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from openinfer_core.errors import InvalidParameterError, TooManyTokensError
from openinfer_server.chat import chat_plan, chat_prompt
from openinfer_server.chat_output import ChatParsing
from openinfer_server.errors import APIError
from openinfer_server.generation import ChoiceResult, respond_with
from openinfer_server.json_body import JSONBodyRoute
from openinfer_server.response_object import ResponseDraft
from openinfer_server.response_store import ResponseStore
from openinfer_server.responses_output import OutputBuilder, item_id, status
from openinfer_server.responses_protocol import ResponsesRequest, responses_field
from openinfer_server.responses_stream import response_events
from openinfer_server.run_plan import build_runs
from openinfer_server.state import StateDep

router = APIRouter(route_class=JSONBodyRoute)


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request,
                          state: StateDep) -> Response:
    state.check_model(body.model)
    state.check_serving()
    history = previous_conversation(body.previous_response_id, state.responses)
    with responses_params():
        chat = body.chat_request(history)
        plan = await chat_plan(chat, state)
        try:
            if history:  # a stored conversation: the prompt is larger than this body
                prompt = await state.threads.run(chat_prompt, chat, state.tokenizer,
                                                 state.prompt_limit)
            else:
                prompt = await state.threads.run_for(request, chat_prompt, chat,
                                                     state.tokenizer, state.prompt_limit)
        except TooManyTokensError as e:
            plan.max_tokens.refuse(e.count, state.max_model_len)
        parsing = state.parsers.for_request(chat.tools, chat.tool_choice, prompt.text)
    draft = ResponseDraft(item_id("resp"), int(time.time()), state.model_name, body,
                          echo_sampling={"temperature": plan.sampling.temperature,
                                         "top_p": plan.sampling.top_p},
                          input_items=(*history, *body.input_items()),
                          store=state.responses if body.store else None)
    state.metrics.intake(request)
    runs = build_runs(state, draft.id, [prompt], plan)

    def whole(choices: list[ChoiceResult]) -> dict[str, Any]:
        [choice] = choices
        return draft.finish(whole_output(parsing, choice), runs[0], choice.finish_reason)

    events = (lambda: response_events(draft, runs[0], parsing)) if body.stream else None
    return await respond_with(request, runs, whole, events, shutdown=state.shutdown)


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, state: StateDep) -> dict[str, Any]:
    stored = state.responses.get(response_id)
    if stored is None:
        raise not_found(response_id)
    return stored.response


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, state: StateDep) -> dict[str, Any]:
    if not state.responses.delete(response_id):
        raise not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


def not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", param="response_id",
                    code="response_not_found")


def previous_conversation(response_id: str | None,
                          store: ResponseStore) -> list[dict[str, Any]]:
    """The stored conversation a follow-up continues (none without `previous_response_id`);
    a 400 for an id never stored here, stored with `store: false`, deleted or evicted."""
    if response_id is None:
        return []
    stored = store.get(response_id)
    if stored is None:
        raise APIError(
            400, f"Previous response with id '{response_id}' not found. Responses are kept in "
            "this server's memory, a bounded number per frontend process, and only when "
            "created with store=true.", param="previous_response_id",
            code="previous_response_not_found")
    return stored.conversation


@contextlib.contextmanager
def responses_params() -> Iterator[None]:
    """Errors from the chat pipeline, naming the Responses field the client sent
    (`max_output_tokens`, not `max_completion_tokens`)."""
    try:
        yield
    except TooManyTokensError:
        raise
    except InvalidParameterError as e:
        reason = str(e).removeprefix(f"{e.param}: ")
        raise InvalidParameterError(responses_field(e.param), reason) from e
    except APIError as e:
        if e.param is not None:
            e.param = responses_field(e.param)
        raise


def whole_output(parsing: ChatParsing, choice: ChoiceResult) -> OutputBuilder:
    """A non-streamed choice's output items: its whole text through the parsers at once."""
    output = parsing.choice()
    piece = output.feed(choice.text)
    piece.extend(output.finish())
    builder = OutputBuilder()
    builder.feed(piece)
    builder.finish(status(choice.finish_reason)[0])
    return builder
