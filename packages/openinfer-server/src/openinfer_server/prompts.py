"""Prompts as the engine takes them: token ids checked against the vocabulary, and how many
tokens each may generate within the model's length."""

from __future__ import annotations

from dataclasses import dataclass

from openinfer_core.errors import InvalidParameterError
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.errors import APIError


@dataclass(frozen=True, slots=True)
class Prompt:
    token_ids: list[int]
    text: str | None  # None when the client sent token ids


def completion_prompts(prompt: str | list[int] | list[str] | list[list[int]],
                       tokenizer: Tokenizer, *, add_special_tokens: bool) -> list[Prompt]:
    """/v1/completions accepts one string, several, one list of ids, or several."""
    if isinstance(prompt, str):
        return [text_prompt(prompt, tokenizer, add_special_tokens=add_special_tokens)]
    if not prompt:
        raise InvalidParameterError("prompt", "must not be empty")
    if all(isinstance(p, int) for p in prompt):
        return [ids_prompt(prompt, tokenizer)]  # type: ignore[arg-type]
    out: list[Prompt] = []
    for p in prompt:
        if isinstance(p, str):
            out.append(text_prompt(p, tokenizer, add_special_tokens=add_special_tokens))
        else:
            out.append(ids_prompt(p, tokenizer))  # type: ignore[arg-type]
    return out


def text_prompt(text: str, tokenizer: Tokenizer, *, add_special_tokens: bool) -> Prompt:
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    if not ids:
        raise InvalidParameterError("prompt", "must contain at least one token, got empty text")
    return Prompt(ids, text)


def ids_prompt(ids: list[int], tokenizer: Tokenizer) -> Prompt:
    if not ids:
        raise InvalidParameterError("prompt", "a token-id prompt must not be empty")
    vocab = tokenizer.vocab_size
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise InvalidParameterError(
                "prompt", f"token id {t!r} is outside the vocabulary (ids 0..{vocab - 1})")
    return Prompt(list(ids), None)


def max_tokens_for(prompt_tokens: int, requested: int | None, *, max_model_len: int,
                   default: int | None, param: str, where: str) -> int:
    """How many tokens a prompt may generate: `requested` when it fits, else a 400 with the
    numbers. Unrequested, `default` (or whatever room is left), capped by the room left."""
    room = max_model_len - prompt_tokens
    if requested is None:
        wanted = room if default is None else min(default, room)
        if wanted >= 1:
            return wanted
        requested, param = max(default or 1, 1), where
    if prompt_tokens + requested <= max_model_len:
        return requested
    raise APIError(
        400, f"This model's maximum context length is {max_model_len} tokens. However, you "
        f"requested {prompt_tokens + requested} tokens ({prompt_tokens} in the {where}, "
        f"{requested} in the completion). Please reduce the length of the {where} or "
        "completion.", param=param, code="context_length_exceeded")
