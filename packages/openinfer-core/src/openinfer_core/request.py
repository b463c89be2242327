"""What a frontend submits to an engine: token ids and how to continue them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from openinfer_core.errors import InvalidParameterError
from openinfer_core.params import SamplingParams


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One generation. The engine never sees text: stop strings and detokenization are the
    frontend's. `max_tokens`, stop token ids and the logprobs count live in `params`.

    `pooling`: an embedding instead (an engine started with task `embed`): the prompt is
    computed, no token is sampled, and the request ends with an `Embedding` event (the final
    normed hidden state of its last prompt token) before its `Finished`; its KV is freed then.
    `params` is ignored."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = field(default_factory=time.time)
    priority: int = 0
    pooling: bool = False

    def __post_init__(self) -> None:
        if not self.request_id:
            raise InvalidParameterError("request_id", "must be a non-empty string")
        ids = tuple(self.prompt_token_ids)
        if not ids:
            raise InvalidParameterError("prompt", "must contain at least one token")
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise InvalidParameterError("prompt", f"token ids must be ints >= 0, got {t!r}")
        object.__setattr__(self, "prompt_token_ids", ids)

    @property
    def max_tokens(self) -> int:
        return self.params.max_tokens
