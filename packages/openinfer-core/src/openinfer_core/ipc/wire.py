"""The messages between frontends and the engine-core process, encoded with msgspec (msgpack).

Frontend -> engine: `Hello` once, then `Add` per request and `Abort`. Engine -> frontend: one
`StepOutput` per step carrying every event of that frontend's requests (token ids, not text)
and the engine's load. Events travel as small array-like structs, not pickles."""

from __future__ import annotations

import msgspec
import numpy as np

from openinfer_core.events import (
    Embedding,
    Error,
    Finished,
    FinishReason,
    PromptLogprobs,
    Rejected,
    Scheduled,
    Token,
    TokenEvent,
)
from openinfer_core.handle import LoadSnapshot, ModelInfo
from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest


# -- frontend -> engine ---------------------------------------------------------------------
class Hello(msgspec.Struct, tag="hello", array_like=True):
    """A frontend's first message on its output socket: the engine answers `Welcome`."""

    frontend: bytes


class Add(msgspec.Struct, tag="add", array_like=True):
    frontend: bytes  # where this request's events go
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    priority: int
    pooling: bool = False

    @classmethod
    def of(cls, frontend: bytes, request: GenerateRequest) -> Add:
        return cls(frontend, request.request_id, list(request.prompt_token_ids), request.params,
                   request.arrival_time, request.priority, request.pooling)

    def request(self) -> GenerateRequest:
        return GenerateRequest(self.request_id, tuple(self.prompt_token_ids), self.params,
                               self.arrival_time, self.priority, self.pooling)


class Abort(msgspec.Struct, tag="abort", array_like=True):
    request_id: str


ToEngine = Hello | Add | Abort


# -- engine -> frontend ---------------------------------------------------------------------
class WScheduled(msgspec.Struct, tag=0, array_like=True):
    request_id: str
    prompt_tokens: int
    cached_tokens: int


class WToken(msgspec.Struct, tag=1, array_like=True):
    request_id: str
    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] = []


class WFinished(msgspec.Struct, tag=2, array_like=True):
    request_id: str
    reason: str
    prompt_tokens: int
    completion_tokens: int
    stop_token_id: int | None = None


class WError(msgspec.Struct, tag=3, array_like=True):
    request_id: str
    message: str


class WRejected(msgspec.Struct, tag=4, array_like=True):
    request_id: str
    message: str


class WPromptLogprobs(msgspec.Struct, tag=5, array_like=True):
    request_id: str
    logprobs: list[float]
    ranks: list[int]
    top: list[list[tuple[int, float]]]


class WEmbedding(msgspec.Struct, tag=6, array_like=True):
    request_id: str
    data: bytes  # the vector as little-endian float32: exact, and a quarter of msgpack floats


WireEvent = (WScheduled | WToken | WFinished | WError | WRejected | WPromptLogprobs
             | WEmbedding)


class Welcome(msgspec.Struct, tag="welcome", array_like=True):
    model_info: ModelInfo
    load: LoadSnapshot


class StepOutput(msgspec.Struct, tag="step", array_like=True):
    events: list[WireEvent]
    load: LoadSnapshot


FromEngine = Welcome | StepOutput


def to_wire(event: TokenEvent) -> WireEvent:
    if isinstance(event, Token):
        if event.logprob is None and not event.top_logprobs:
            return WToken(event.request_id, event.token_id)
        return WToken(event.request_id, event.token_id, event.logprob,
                      list(event.top_logprobs))
    if isinstance(event, Scheduled):
        return WScheduled(event.request_id, event.prompt_tokens, event.cached_tokens)
    if isinstance(event, Finished):
        return WFinished(event.request_id, event.reason.value, event.prompt_tokens,
                         event.completion_tokens, event.stop_token_id)
    if isinstance(event, Error):
        return WError(event.request_id, event.message)
    if isinstance(event, PromptLogprobs):
        return WPromptLogprobs(event.request_id, list(event.logprobs), list(event.ranks),
                               [list(t) for t in event.top])
    if isinstance(event, Embedding):
        return WEmbedding(event.request_id, np.asarray(event.vector, "<f4").tobytes())
    return WRejected(event.request_id, event.message)


def from_wire(event: WireEvent) -> TokenEvent:
    if isinstance(event, WToken):
        return Token(event.request_id, event.token_id, event.logprob,
                     tuple(event.top_logprobs))
    if isinstance(event, WScheduled):
        return Scheduled(event.request_id, event.prompt_tokens, event.cached_tokens)
    if isinstance(event, WFinished):
        return Finished(event.request_id, FinishReason(event.reason), event.prompt_tokens,
                        event.completion_tokens, event.stop_token_id)
    if isinstance(event, WError):
        return Error(event.request_id, event.message)
    if isinstance(event, WPromptLogprobs):
        return PromptLogprobs(event.request_id, tuple(event.logprobs), tuple(event.ranks),
                              tuple(tuple((int(i), float(lp)) for i, lp in t)
                                    for t in event.top))
    if isinstance(event, WEmbedding):
        return Embedding(event.request_id, tuple(np.frombuffer(event.data, "<f4").tolist()))
    return Rejected(event.request_id, event.message)
