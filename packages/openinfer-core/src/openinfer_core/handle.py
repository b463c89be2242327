"""The async face of an engine, as servers see it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from openinfer_core.events import TokenEvent
from openinfer_core.interfaces.kv import PrefixCacheStats
from openinfer_core.interfaces.offload import OffloadStats, TierStats  # noqa: F401 (msgspec)
from openinfer_core.request import GenerateRequest

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing.TypeIs from Python 3.13


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    max_model_len: int
    kv_total_blocks: int
    kv_block_size: int
    eos_token_ids: tuple[int, ...]
    # "generate" (tokens), or "embed" (pooling requests only: `GenerateRequest.pooling`).
    task: str = "generate"
    hidden_size: int = 0  # the length of an `Embedding` vector; 0 where the task is generate

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_total_blocks * self.kv_block_size


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    running: int
    waiting: int
    kv_used_blocks: int
    kv_total_blocks: int
    prefix_cache: PrefixCacheStats = field(default_factory=PrefixCacheStats)  # engine totals
    num_preemptions: int = 0  # total since the engine started
    offload: OffloadStats | None = None  # None without --kv-offload


@runtime_checkable
class EngineHandle(Protocol):
    """Token ids in, events out. Safe to call from any asyncio task; the engine itself runs on
    its own thread."""

    def generate(self, request: GenerateRequest) -> AsyncIterator[TokenEvent]:
        """Submit `request`; yields its events, ending with exactly one terminal event.
        Leaving the iterator early aborts the request."""
        ...

    def abort(self, request_id: str) -> None:
        """Cancel a request; its KV blocks are freed at the next step. Unknown ids are ignored."""
        ...

    @property
    def model_info(self) -> ModelInfo: ...

    @property
    def dead(self) -> str | None:
        """Why the engine can no longer serve (its process or loop died), or None while it
        can. Once set, every request ends with `Error`; the server answers /health with 503
        and stops. Over data-parallel replicas: set once any replica died, whose requests end
        with `Error`; the live replicas serve on until the server has stopped."""
        ...

    def load(self) -> LoadSnapshot:
        """Running / waiting requests and KV use, for metrics. Never blocks on the engine."""
        ...


@runtime_checkable
class SupportsReplicaLoads(Protocol):
    """A handle over data-parallel replicas (`openinfer_core.ipc.router.ReplicaRouter`), whose
    metrics are reported per replica."""

    def replica_loads(self) -> list[LoadSnapshot]:
        """Each replica's `load()`, in replica order. Never blocks on an engine."""
        ...


def supports_replica_loads(engine: object) -> TypeIs[SupportsReplicaLoads]:
    return isinstance(engine, SupportsReplicaLoads)
