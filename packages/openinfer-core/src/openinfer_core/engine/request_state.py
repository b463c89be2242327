"""A request's state inside the engine: its tokens and how many of them have KV."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from openinfer_core.request import GenerateRequest

# A slot in `RequestState.token_ids` for a token sampled by a step still running on the device
# (overlapped steps): the next step is scheduled before its value is known.
PENDING = -1


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class RequestState:
    """`token_ids` is prompt + output so far; `num_computed_tokens` of them have KV in the
    cache. A step computes the next `num_tokens - num_computed_tokens` (or a budgeted chunk);
    that single rule covers prefill, chunked prefill, decode and recompute after preemption."""

    request: GenerateRequest
    token_ids: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    announced: bool = False  # Scheduled was emitted
    offload_probed: bool = False  # its prefix was looked up in the offload tiers
    num_preemptions: int = 0

    @classmethod
    def from_request(cls, request: GenerateRequest) -> RequestState:
        ids = list(request.prompt_token_ids)
        return cls(request=request, token_ids=ids, num_prompt_tokens=len(ids))

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_settled_tokens(self) -> int:
        """Tokens before the first PENDING slot (all of them, when none is pending)."""
        n = len(self.token_ids)
        while n and self.token_ids[n - 1] == PENDING:
            n -= 1
        return n

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]
