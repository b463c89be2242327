"""vLLM's POST /tokenize, POST /detokenize and GET /tokenizer_info: the served model's
tokenizer over HTTP, so a client can count tokens, or see exactly what a chat request feeds
the model, without generating anything. lm-eval's remote tokenizer
(`tokenizer_backend=remote`) reads its special tokens and chat template from /tokenizer_info
and tokenizes through the other two."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import Discriminator, Field, StrictInt, Tag
from starlette.responses import JSONResponse

from openinfer_core.errors import InvalidParameterError
from openinfer_server.chat import chat_prompt
from openinfer_server.json_body import JSONBodyRoute
from openinfer_server.prompt_limit import PromptLimit
from openinfer_server.protocol import ChatCompletionRequest, ChatMessage, _Body
from openinfer_server.state import ServerState, StateDep

router = APIRouter(route_class=JSONBodyRoute)


class TokenizeCompletionRequest(_Body):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(_Body):
    """Rendered exactly as /v1/chat/completions renders it (same template, same checks)."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # The template already writes the special tokens, as in chat completions.
    add_special_tokens: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False


def _kind(body: Any) -> str:
    chat = "messages" in body if isinstance(body, dict) else hasattr(body, "messages")
    return "chat-tokenize" if chat else "prompt-tokenize"


# Chosen by the presence of `messages`, so a bad body gets the errors of the one shape it
# meant, not both. (A tag with a '-' never shows up as a field in error messages.)
TokenizeRequest = Annotated[
    Annotated[TokenizeCompletionRequest, Tag("prompt-tokenize")]
    | Annotated[TokenizeChatRequest, Tag("chat-tokenize")],
    Discriminator(_kind)]


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[StrictInt]


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, state: StateDep) -> JSONResponse:
    state.check_model(body.model)
    return await state.threads.run(_tokenize, body, state)


def _tokenize(body: TokenizeCompletionRequest | TokenizeChatRequest,
              state: ServerState) -> JSONResponse:
    """On a worker thread: the ids, and the response rendered (a long list takes a while)."""
    limit = state.prompt_limit.counting_only()
    if isinstance(body, TokenizeCompletionRequest):
        limit.check_chars(body.prompt, "prompt")
        ids = state.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    else:
        ids = _chat_ids(body, state, limit)
    strs = state.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return JSONResponse({"count": len(ids), "max_model_len": state.max_model_len,
                         "tokens": ids, "token_strs": strs})


def _chat_ids(body: TokenizeChatRequest, state: ServerState, limit: PromptLimit) -> list[int]:
    if body.continue_final_message and body.add_generation_prompt:
        raise InvalidParameterError(
            "continue_final_message", "cannot be combined with add_generation_prompt=true; "
            "set add_generation_prompt to false")
    chat = ChatCompletionRequest.model_validate({
        "messages": body.messages, "tools": body.tools,
        "chat_template_kwargs": body.chat_template_kwargs,
        "reasoning_effort": body.reasoning_effort,
        "add_generation_prompt": body.add_generation_prompt,
        "continue_final_message": body.continue_final_message})
    chat.refuse_unsupported()  # what chat completions cannot render, tokenize refuses too
    prompt = chat_prompt(chat, state.tokenizer, limit)
    if not body.add_special_tokens:
        return prompt.token_ids
    assert prompt.text is not None
    return state.tokenizer.encode(prompt.text, add_special_tokens=True)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, state: StateDep) -> JSONResponse:
    state.check_model(body.model)
    return await state.threads.run(_detokenize, body, state)


def _detokenize(body: DetokenizeRequest, state: ServerState) -> JSONResponse:
    vocab = state.tokenizer.vocab_size
    for t in body.tokens:
        if not 0 <= t < vocab:
            raise InvalidParameterError(
                "tokens", f"token id {t} is outside the vocabulary (ids 0..{vocab - 1})")
    return JSONResponse({"prompt": state.tokenizer.decode(body.tokens)})


# Paths on the server's disk, and the template (sent as the one in use, or not at all).
_NOT_SHOWN = frozenset({"vocab_file", "merges_file", "tokenizer_file", "chat_template"})


@router.get("/tokenizer_info")
async def tokenizer_info(state: StateDep) -> JSONResponse:
    """vLLM's shape: the checkpoint's tokenizer_config.json (added tokens as their text),
    `tokenizer_class`, the special tokens, `model_max_length` and the chat template in use,
    plus `max_model_len`, the longest sequence this server takes."""
    tokenizer = state.tokenizer
    info: dict[str, Any] = {k: _plain(v) for k, v in tokenizer.config.items()
                            if k not in _NOT_SHOWN}
    info.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    info.setdefault("model_max_length", state.max_model_len)
    info.update(bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
                pad_token=tokenizer.pad_token, max_model_len=state.max_model_len,
                vocab_size=tokenizer.vocab_size)
    template = tokenizer.chat_template if tokenizer.chat_encoder is None else None
    if template is not None:
        info["chat_template"] = template.source
    return JSONResponse(info)


def _plain(value: Any) -> Any:
    """A token written as {"content": ...} (an AddedToken) becomes its text, as vLLM sends
    the tokenizer's settings."""
    if isinstance(value, dict):
        if isinstance(value.get("content"), str):
            return value["content"]
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
