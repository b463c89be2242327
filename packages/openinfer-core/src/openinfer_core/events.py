"""What an engine emits per request, in this order:
`Scheduled` once, then `PromptLogprobs` once if the request asked for them, then `Token`*, then
exactly one terminal (`Finished`, `Error`, `Rejected`). A pooling request
(`GenerateRequest.pooling`) gets `Scheduled`, one `Embedding`, then `Finished` (reason stop, no
completion tokens)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FinishReason(enum.StrEnum):
    STOP = "stop"  # an end-of-sequence or stop token id (not emitted as a Token)
    LENGTH = "length"  # max_tokens or the model's length reached (the last token is emitted)
    ABORT = "abort"  # the client cancelled (abort() or it went away)


@dataclass(frozen=True, slots=True)
class Scheduled:
    request_id: str
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class PromptLogprobs:
    """Logprobs of prompt tokens 1..P-1, each given the tokens before it (token 0 has none):
    `logprobs[i]` and `ranks[i]` (1 = the most likely) are prompt token i+1's, and `top[i]`
    the best (token id, logprob) pairs at that position, best first, ties by lower id."""

    request_id: str
    logprobs: tuple[float, ...]
    ranks: tuple[int, ...]
    top: tuple[tuple[tuple[int, float], ...], ...]


@dataclass(frozen=True, slots=True)
class Token:
    """One generated token. `logprob` is set when the request asked for logprobs;
    `top_logprobs` holds (token id, logprob) pairs, best first."""

    request_id: str
    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Embedding:
    """A pooling request's vector: the final normed hidden state of its last prompt token
    (fp32 values, not normalized: the frontend normalizes and truncates)."""

    request_id: str
    vector: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Finished:
    request_id: str
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    # The stop token id that ended the request (reason STOP), else None.
    stop_token_id: int | None = None


@dataclass(frozen=True, slots=True)
class Error:
    """The engine failed while running this request."""

    request_id: str
    message: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """The engine refused the request (it can never fit, or asks for what we do not honour)."""

    request_id: str
    message: str


TokenEvent = Scheduled | PromptLogprobs | Token | Embedding | Finished | Error | Rejected
TerminalEvent = Finished | Error | Rejected
TERMINAL_TYPES = (Finished, Error, Rejected)


def is_terminal(event: TokenEvent) -> bool:
    return isinstance(event, TERMINAL_TYPES)
