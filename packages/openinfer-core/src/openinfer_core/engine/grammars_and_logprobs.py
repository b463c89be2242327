"""The request features that wrap a step's schedule -> execute -> update: a grammar's token
mask before sampling (structured output: requests wait here while their grammar compiles),
prompt logprobs after the forward (emitted once, before a request's first token), and a pooling
request's `Embedding` (placed before its `Finished`)."""

from __future__ import annotations

import logging
from pathlib import Path

from openinfer_core.engine.pooling import place_embeddings
from openinfer_core.engine.prompt_logprobs import PromptLogprobCollector
from openinfer_core.engine.runner import Forwarded, Launched
from openinfer_core.events import Finished, FinishReason, TokenEvent, is_terminal
from openinfer_core.request import GenerateRequest
from openinfer_core.sampling.token_mask import TokenMask
from openinfer_core.structured.manager import StructuredOutputs

log = logging.getLogger("openinfer")

# With nothing to run but grammars compiling, a step waits this long for one to finish.
COMPILE_WAIT_S = 0.005


class GrammarsAndLogprobs:
    """Grammars and prompt logprobs for the engine loop (`Engine`, `OverlappedLoop`). Engine
    thread only."""

    def __init__(self, model_dir: Path, vocab_size: int, eos_token_ids: tuple[int, ...]):
        self.structured = StructuredOutputs(model_dir, vocab_size, eos_token_ids)
        self._prompt = PromptLogprobCollector()

    # -- requests -----------------------------------------------------------------------
    def hold(self, request: GenerateRequest) -> bool:
        """Keep a request back while its grammar compiles; False if it has none."""
        if request.params.structured is None:
            return False
        self.structured.submit(request)
        return True

    def abort(self, request_id: str) -> list[TokenEvent]:
        """The terminal event of an aborted request still held back, else nothing."""
        request = self.structured.abort(request_id)
        if request is None:
            return []
        return [Finished(request_id, FinishReason.ABORT, len(request.prompt_token_ids), 0)]

    def release(self) -> tuple[list[GenerateRequest], list[TokenEvent]]:
        """Requests whose grammar is ready, and refusals of those whose grammar failed."""
        return self.structured.ready()

    def holding(self) -> bool:
        return self.structured.compiling()

    def idle_wait(self) -> None:
        self.structured.wait(COMPILE_WAIT_S)

    # -- steps --------------------------------------------------------------------------
    def token_mask(self, fwd: Forwarded) -> TokenMask | None:
        return self.structured.token_mask(fwd.sampling_rows, fwd.logits.device)

    def needs_mask(self, fwd: Forwarded) -> bool:
        return self.structured.constrains(fwd.sampling_rows)

    def finished(self, launched: Launched, events: list[TokenEvent]) -> None:
        """A step's results are in (`events` from its update): collect its prompt logprobs and
        move grammars on by its tokens; put its pooled vectors into `events` (in place)."""
        if launched.pooled is not None:
            place_embeddings(launched.pooled, events)
        if launched.prompt_logprobs is not None:
            lengths = {r.seq.request_id: r.seq.num_prompt_tokens for r in launched.output.rows}
            self._prompt.add(launched.prompt_logprobs, lengths)
        self.structured.observe(events)

    def emit(self, events: list[TokenEvent]) -> list[TokenEvent]:
        """A whole iteration's events, in order, with prompt logprobs put in place; forgets
        what ended."""
        events = self._prompt.emit(events)
        self.structured.forget(e.request_id for e in events if is_terminal(e))
        return events
