"""Scheduling policies: which requests run this step, with how many tokens each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from openinfer_core.events import TokenEvent
from openinfer_core.handle import LoadSnapshot
from openinfer_core.interfaces.kv import KVManager
from openinfer_core.request import GenerateRequest

if TYPE_CHECKING:
    from openinfer_core.engine.request_state import RequestState
    from openinfer_core.sampling.sampler import SampledToken


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    eos_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ScheduledRow:
    """`num_new_tokens` tokens of `seq` run this step; `samples` when they reach its end, so the
    step yields its next token."""

    seq: RequestState
    num_new_tokens: int
    samples: bool


@dataclass(slots=True)
class SchedulerOutput:
    rows: list[ScheduledRow] = field(default_factory=list)
    events: list[TokenEvent] = field(default_factory=list)  # Scheduled / Rejected, in order
    # Set by `Scheduler.launched`: where in its sequence's `token_ids` each sampling row's token
    # goes (a PENDING slot until `update`), in row order.
    launched: bool = False
    pending: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(r.num_new_tokens for r in self.rows)


@runtime_checkable
class Scheduler(Protocol):
    """Registered through `openinfer_register_schedulers`; built as `cls(config, kv)`.
    All methods run on the engine thread and may mutate the scheduler and `kv`."""

    def __init__(self, config: SchedulerConfig, kv: KVManager) -> None: ...

    def add(self, request: GenerateRequest) -> None:
        """Queue a new request, or refuse it (one it can never run): its `Rejected` then comes
        out with the next `schedule()`'s events."""
        ...

    def abort(self, request_id: str) -> list[TokenEvent]:
        """Drop a request wherever it is, free its KV; returns its terminal event (none for an
        unknown or finished id)."""
        ...

    def schedule(self) -> SchedulerOutput:
        """Choose this step's rows within the token budget, allocating their KV; may preempt."""
        ...

    def launched(self, output: SchedulerOutput) -> None:
        """The step is on the device: count its tokens as computed and give each sampling row a
        PENDING slot at the end of its tokens, so the next step can be scheduled before this
        one's tokens are known (overlapped steps). A request whose pending token ends it
        whatever it is (max_tokens, model length) is not scheduled again, nor is a pooling
        request whose prompt this step completes (it gets no slot). Idempotent."""
        ...

    def update(self, output: SchedulerOutput, sampled: Sequence[SampledToken]) -> list[TokenEvent]:
        """Apply a step's results (`sampled` aligns with the rows that sample): fill the PENDING
        slots (calling `launched` first if the loop did not), finish requests and free their KV
        (a pooling request whose prompt the step completed: `Finished(stop)`, its `Embedding`
        put before it by the engine).
        Returns the events, in order. With overlapped steps the next step may already have
        been scheduled; a request that stops here drops what was scheduled past its end."""
        ...

    def fail(self, output: SchedulerOutput, message: str) -> list[TokenEvent]:
        """The step's execution raised: end every request in it with `Error`, free their KV."""
        ...

    def has_work(self) -> bool: ...

    def snapshot(self) -> LoadSnapshot: ...
