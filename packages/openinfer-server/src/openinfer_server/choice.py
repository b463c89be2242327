"""One choice of a response: an engine request's events turned into text deltas.

Detokenization and stop strings run here, on the event loop, so the engine thread only ever
sees token ids. A stop-string hit ends the choice and aborts the engine request."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import NoReturn

from openinfer_core.events import (
    Error,
    Finished,
    PromptLogprobs,
    Rejected,
    Scheduled,
    Token,
    TokenEvent,
)
from openinfer_core.handle import EngineHandle
from openinfer_core.request import GenerateRequest
from openinfer_core.text.detokenizer import IncrementalDetokenizer
from openinfer_core.text.stop_strings import StopStringMatcher
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.availability import engine_dead
from openinfer_server.errors import APIError
from openinfer_server.logprobs import TokenLogprob
from openinfer_server.metrics import ServerMetrics


@dataclass(frozen=True, slots=True)
class PromptScores:
    """vLLM's `prompt_logprobs` of a choice: the prompt and the engine's logprobs of it
    (None for a one-token prompt, which has nothing to score)."""

    token_ids: tuple[int, ...]
    event: PromptLogprobs | None


@dataclass(slots=True)
class ChoiceDelta:
    """New text of one choice, the tokens that arrived with it (when logprobs were asked
    for), and on the last delta the finish reason. The first delta of a choice that asked for
    prompt logprobs carries them."""

    index: int
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt: PromptScores | None = None


def prompt_offsets(tokenizer: Tokenizer, ids: tuple[int, ...],
                   skip_special_tokens: bool) -> list[int]:
    """Where each prompt token's text begins in the decoded prompt."""
    detok = IncrementalDetokenizer(tokenizer, (), skip_special_tokens=skip_special_tokens)
    offsets: list[int] = []
    length = 0
    for token_id in ids:
        offsets.append(length)
        length += len(detok.push(token_id))
    return offsets


class ChoiceRun:
    """Drives one engine request. `start()` submits it and waits until it is scheduled;
    `deltas()` yields its output; `aclose()` aborts it if it has not finished. Event loop
    only; not thread-safe."""

    def __init__(self, engine: EngineHandle, request: GenerateRequest, index: int,
                 tokenizer: Tokenizer, metrics: ServerMetrics, *, prefix: str = "",
                 echo_logprobs: bool = False, prompt_scores: bool = False,
                 score_only: bool = False) -> None:
        """`prefix` is the echoed prompt text; `echo_logprobs` puts the prompt's tokens first
        in the logprobs (the first with none), `prompt_scores` sends vLLM's prompt_logprobs,
        and `score_only` (max_tokens 0 with echo) drops the one token the engine makes."""
        params = request.params
        self.index = index
        self.request = request
        self.prompt_tokens = len(request.prompt_token_ids)
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self._engine = engine
        self._events = engine.generate(request)
        self._metrics = metrics
        self._logprobs = params.logprobs is not None
        self._detok = IncrementalDetokenizer(tokenizer, request.prompt_token_ids,
                                             skip_special_tokens=params.skip_special_tokens)
        self._stop = StopStringMatcher(
            params.stop, include_stop_str_in_output=params.include_stop_str_in_output,
        ) if params.stop else None
        self._prefix = prefix
        self._tokenizer = tokenizer
        self._echo_logprobs = echo_logprobs
        self._prompt_scores = prompt_scores
        self._score_only = score_only
        self._chars = 0  # characters of text yielded so far
        self._submitted = False
        self._engine_done = False  # the engine sent a terminal event
        self._done = False  # this choice has ended (engine terminal, stop string or abort)
        self._arrival = time.monotonic()
        self._last_token: float | None = None

    @property
    def done(self) -> bool:
        return self._done

    async def start(self) -> None:
        """Submit the request; return once it is scheduled. Raises APIError if the engine
        rejects it (400), fails (500) or has died (503)."""
        self._submitted = True
        event = await anext(self._events, None)
        if not isinstance(event, Scheduled):
            self._fail(event)
        self.cached_tokens = event.cached_tokens
        self._metrics.scheduled(self.prompt_tokens)

    async def deltas(self) -> AsyncIterator[ChoiceDelta]:
        """The choice's output after `start()`: deltas with text or tokens, the last one
        with finish_reason. Raises APIError if the engine fails midway."""
        opened = not (self._echo_logprobs or self._prompt_scores)
        if self._prefix and opened:
            yield self._delta(self._prefix, [])
        async for event in self._events:
            if not opened:  # the prompt's logprobs come first, when the prompt has any
                opened = True
                scored = event if isinstance(event, PromptLogprobs) else None
                yield self._prompt_delta(scored)
                if scored is not None:
                    continue
            if isinstance(event, Token):
                if self._score_only:
                    continue
                delta = self._on_token(event)
                if delta is not None:
                    yield delta
                if self._done:
                    await self.aclose()  # a stop string ended it; the engine need not go on
                    return
            elif isinstance(event, Finished):
                yield self._on_finished(event)
                return
            else:
                self._fail(event)
        self._fail(None)  # the events ended without a terminal one

    async def aclose(self) -> None:
        """Abort the engine request unless it has finished; idempotent."""
        if self._submitted and not self._done:
            self._finish("abort")
        if self._submitted and not self._engine_done:
            self._engine_done = True
            self._engine.abort(self.request.request_id)
        closer = getattr(self._events, "aclose", None)
        if closer is not None:
            await closer()

    def _on_token(self, event: Token) -> ChoiceDelta | None:
        now = time.monotonic()
        gap = None if self._last_token is None else now - self._last_token
        self._metrics.token(gap, now - self._arrival)
        self._last_token = now
        self.completion_tokens += 1
        tokens = [self._entry(event)] if self._logprobs else []
        text = self._detok.push(event.token_id)
        if self._stop is not None and text:
            text, hit = self._stop.feed(text)
            if hit:
                self._finish("stop")
                return self._delta(text, tokens, "stop", self._stop.matched)
        return self._delta(text, tokens) if text or tokens else None

    def _on_finished(self, event: Finished) -> ChoiceDelta:
        self._engine_done = True
        text = self._detok.flush()
        if self._stop is not None:
            text, hit = self._stop.feed(text) if text else ("", False)
            if hit:
                self._finish("stop")
                return self._delta(text, [], "stop", self._stop.matched)
            text += self._stop.flush()
        self.completion_tokens = 0 if self._score_only else event.completion_tokens
        reason = event.reason.value
        self._finish(reason)
        return self._delta(text, [], reason, event.stop_token_id)

    def _prompt_delta(self, event: PromptLogprobs | None) -> ChoiceDelta:
        ids = self.request.prompt_token_ids
        tokens: list[TokenLogprob] = []
        if self._echo_logprobs:
            offsets = prompt_offsets(self._tokenizer, ids, self.request.params.skip_special_tokens)
            tokens.append(TokenLogprob(ids[0], None, None, offsets[0]))
            for i in range(1, len(ids)):
                assert event is not None
                tokens.append(TokenLogprob(ids[i], event.logprobs[i - 1], event.top[i - 1],
                                           offsets[i]))
        delta = self._delta(self._prefix, tokens)
        if self._prompt_scores:
            delta.prompt = PromptScores(ids, event)
        return delta

    def _entry(self, event: Token) -> TokenLogprob:
        logprob = event.logprob if event.logprob is not None else 0.0
        return TokenLogprob(event.token_id, logprob, event.top_logprobs, self._chars)

    def _delta(self, text: str, tokens: list[TokenLogprob], finish: str | None = None,
               stop_reason: int | str | None = None) -> ChoiceDelta:
        self._chars += len(text)
        return ChoiceDelta(self.index, text, tokens, finish, stop_reason)

    def _finish(self, reason: str) -> None:
        self._done = True
        self.finish_reason = reason
        self._metrics.finished(reason, time.monotonic() - self._arrival)

    def _fail(self, event: TokenEvent | None) -> NoReturn:
        self._done = True
        self._engine_done = isinstance(event, Error | Rejected)
        if isinstance(event, Rejected):
            raise APIError(400, event.message)
        if isinstance(event, Error):
            dead = self._engine.dead
            if dead is not None:  # not this request's doing: a 503, as for new requests
                raise engine_dead(dead)
            raise APIError(500, f"the engine failed on this request: {event.message}")
        raise APIError(500, f"the engine broke its event order: got {event!r} "
                            f"for request {self.request.request_id}")
