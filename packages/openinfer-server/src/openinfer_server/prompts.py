"""Prompts as the engine takes them: token ids checked against the vocabulary, and how many
tokens each may generate within the model's length."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from openinfer_core.errors import InvalidParameterError, TooManyTokensError
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.errors import APIError
from openinfer_server.prompt_limit import PromptLimit


@dataclass(frozen=True, slots=True)
class Prompt:
    token_ids: list[int]
    text: str | None  # None when the client sent token ids


def completion_prompts(prompt: str | list[int] | list[str] | list[list[int]],
                       tokenizer: Tokenizer, *, add_special_tokens: bool,
                       limit: PromptLimit) -> list[Prompt]:
    """/v1/completions accepts one string, several, one list of ids, or several. Tokenizes:
    call it on a worker thread (`TokenizerThreads`)."""
    if isinstance(prompt, str):
        return [text_prompt(prompt, tokenizer, add_special_tokens=add_special_tokens,
                            limit=limit)]
    if not prompt:
        raise InvalidParameterError("prompt", "must not be empty")
    if all(isinstance(p, int) for p in prompt):
        return [ids_prompt(prompt, tokenizer, limit)]  # type: ignore[arg-type]
    out: list[Prompt] = []
    for p in prompt:
        if isinstance(p, str):
            out.append(text_prompt(p, tokenizer, add_special_tokens=add_special_tokens,
                                   limit=limit))
        else:
            out.append(ids_prompt(p, tokenizer, limit))  # type: ignore[arg-type]
    return out


def text_prompt(text: str, tokenizer: Tokenizer, *, add_special_tokens: bool,
                limit: PromptLimit, where: str = "prompt") -> Prompt:
    """`text` tokenized, unless it is too long in characters (a 400 before tokenizing) or in
    tokens (`TooManyTokensError`, before its ids are listed)."""
    limit.check_chars(text, where)
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens,
                           max_tokens=limit.max_tokens)
    if not ids:
        raise InvalidParameterError(where, "must contain at least one token, got empty text")
    return Prompt(ids, text)


def ids_prompt(ids: list[int], tokenizer: Tokenizer, limit: PromptLimit) -> Prompt:
    if not ids:
        raise InvalidParameterError("prompt", "a token-id prompt must not be empty")
    if limit.max_tokens is not None and len(ids) > limit.max_tokens:
        raise TooManyTokensError(len(ids), limit.max_tokens)
    vocab = tokenizer.vocab_size
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise InvalidParameterError(
                "prompt", f"token id {t!r} is outside the vocabulary (ids 0..{vocab - 1})")
    return Prompt(list(ids), None)


@dataclass(frozen=True, slots=True)
class MaxTokens:
    """How many tokens each prompt of a request may generate; decided here and nowhere else.

    `requested` is the client's value (None when left out), `default` what an unrequested
    prompt gets (None: whatever room the prompt leaves), `param` the request field and `where`
    the prompt's name ("prompt", "messages") that a context-length error names."""

    requested: int | None
    default: int | None
    param: str
    where: str

    @property
    def score_only(self) -> bool:
        """max_tokens 0 (completions with echo): the prompt is scored and nothing generated.
        The engine makes one token, which the choice drops."""
        return self.requested == 0

    @property
    def _asked(self) -> int | None:
        return 1 if self.score_only else self.requested

    def ceiling(self, max_model_len: int) -> int:
        """The most any prompt of the request may generate (`for_prompt` never gives more):
        what the sampling fields (min_tokens) are checked against before the prompts are
        known."""
        asked = self._asked
        return asked if asked is not None else max_model_len

    def refuse(self, prompt_tokens: int, max_model_len: int) -> NoReturn:
        """`for_prompt`'s 400 for a prompt of `max_model_len` tokens or more, which leaves no
        room to generate (a `TooManyTokensError` from tokenizing it)."""
        self.for_prompt(prompt_tokens, max_model_len)
        raise AssertionError(f"a prompt of {prompt_tokens} tokens fits in {max_model_len}")

    def for_prompt(self, prompt_tokens: int, max_model_len: int) -> int:
        """The prompt's own: the requested number when it fits, else a 400 with the numbers.
        Unrequested, `default` (or whatever room is left), capped by the room left."""
        requested, param = self._asked, self.param
        room = max_model_len - prompt_tokens
        if requested is None:
            wanted = room if self.default is None else min(self.default, room)
            if wanted >= 1:
                return wanted
            requested, param = max(self.default or 1, 1), self.where
        if prompt_tokens + requested <= max_model_len:
            return requested
        where = self.where
        raise APIError(
            400, f"This model's maximum context length is {max_model_len} tokens. However, "
            f"you requested {prompt_tokens + requested} tokens ({prompt_tokens} in the {where}, "
            f"{requested} in the completion). Please reduce the length of the {where} or "
            "completion.", param=param, code="context_length_exceeded")
