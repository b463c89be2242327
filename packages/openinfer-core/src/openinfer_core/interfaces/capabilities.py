"""Optional capabilities: what a model, a model line or a scheduler may offer beyond its
required protocol, each a small `Protocol` with a `supports_x(obj)` check.

The engine asks `supports_x(obj)` and, where it is true, mypy knows the attributes exist: a
capability is declared by implementing its protocol, never by an attribute the engine probes
for. Without one, the engine takes the plain path named in each docstring.

A capability whose use also depends on a runtime value (`cuda_graph_safe`: a Qwen3 model on
the `torch` attention backend cannot be captured) keeps that value in the protocol, and the
caller checks it after `supports_x`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Sequence
    from contextlib import AbstractContextManager

    import torch
    from typing_extensions import TypeIs  # typing.TypeIs from Python 3.13

    from openinfer_core.interfaces.kv import KVGroupSpec, KVManager, KVStepLimits
    from openinfer_core.interfaces.model import ForwardBatch, HostBatch, Model
    from openinfer_core.interfaces.offload import PrefixRestorer
    from openinfer_core.interfaces.sampling import SamplingKernels


# -- models ---------------------------------------------------------------------------------
@runtime_checkable
class SupportsCudaGraphs(Protocol):
    """A model whose `forward` the engine may capture in CUDA graphs; also an attention
    backend whose `attend` may be captured (a model line asks its backend).

    `cuda_graph_safe`: on a decode batch (one token per request) `forward` makes no host
    synchronisation and launches the same kernels whatever the context lengths. False where
    this instance cannot be captured after all (e.g. its attention backend cannot).
    `cuda_graph_max_tokens`: the same holds for any batch of up to this many tokens run with
    `max_query_len` = T, so mixed steps (prefill chunks beside decodes) are captured too; 0:
    decode steps only. Without the capability every step runs eagerly."""

    cuda_graph_safe: bool
    cuda_graph_max_tokens: int


def supports_cuda_graphs(model: object) -> TypeIs[SupportsCudaGraphs]:
    return isinstance(model, SupportsCudaGraphs)


@dataclass(frozen=True, slots=True)
class GraphPlan:
    """What the engine's `CudaGraphRunner` is built from: a graph peer builds the same one."""

    max_batch: int
    max_blocks_per_seq: int
    mixed_max_tokens: int
    # The model's KV groups where it has several (`SupportsKVGroups`): one table buffer each.
    kv_groups: tuple[KVGroupSpec, ...] = ()


@runtime_checkable
class SupportsGraphPeers(Protocol):
    """A model whose forward also runs in other processes that must capture and replay the
    engine's CUDA graphs with it (tensor-parallel ranks: their collectives meet inside the
    graphs). The engine's graph runner tells them before its own capture and replay; the
    forwards it runs inside `capturing` are the captures', not steps to send. Without it a
    model is captured alone."""

    def capturing(self, plan: GraphPlan, keys: Sequence[tuple[str, int]],
                  reset: bool) -> AbstractContextManager[None]: ...

    def replaying(self, key: tuple[str, int], host: HostBatch) -> None: ...


def supports_graph_peers(model: object) -> TypeIs[SupportsGraphPeers]:
    return isinstance(model, SupportsGraphPeers)


@runtime_checkable
class SupportsSamplingKernels(Protocol):
    """A model whose logits the sampler draws from with these device kernels
    (`openinfer_kernels.sampling.SAMPLING_KERNELS`). Without it the sampler runs its
    plain-torch path, which gives the same law but costs host work per step."""

    sampling_kernels: SamplingKernels


def supports_sampling_kernels(model: object) -> TypeIs[SupportsSamplingKernels]:
    return isinstance(model, SupportsSamplingKernels)


def sampling_kernels_of(model: object) -> SamplingKernels | None:
    """The model's sampling kernels, or None: what `Sampler(..., kernels=)` takes."""
    return model.sampling_kernels if supports_sampling_kernels(model) else None


@runtime_checkable
class SupportsWeightBytes(Protocol):
    """A model that knows how many weight bytes one decode step reads (per device): the
    benchmarks' weight-read floor. Without it they report no floor."""

    weight_bytes: int


def supports_weight_bytes(model: object) -> TypeIs[SupportsWeightBytes]:
    return isinstance(model, SupportsWeightBytes)


@runtime_checkable
class SupportsKVOffload(Protocol):
    """A model whose KV blocks the offload tiers may copy (`--kv-offload`). Without it
    `--kv-offload` is refused at start."""

    def kv_block_tensors(self) -> list[torch.Tensor]:
        """Every device tensor indexed by KV block id on dim 0: block b's KV is `t[b]` of each.
        Valid after `create_kv_cache`. Pure."""
        ...


def supports_kv_offload(model: object) -> TypeIs[SupportsKVOffload]:
    return isinstance(model, SupportsKVOffload)


@runtime_checkable
class SupportsKVGroupOffload(Protocol):
    """A model with window KV groups whose blocks the offload tiers may copy, group by group
    (`--kv-offload` needs it where `kv_groups` has a window group)."""

    def kv_group_block_tensors(self) -> tuple[list[torch.Tensor], ...]:
        """`SupportsKVOffload.kv_block_tensors` per group, in `kv_groups` order: each group's
        device tensors indexed by its pool's block ids on dim 0 (empty for a state group).
        Valid after `create_kv_cache`. Pure."""
        ...


def supports_kv_group_offload(model: object) -> TypeIs[SupportsKVGroupOffload]:
    return isinstance(model, SupportsKVGroupOffload)


@runtime_checkable
class SupportsKVGroups(Protocol):
    """A model that keeps its KV in several groups (`interfaces.kv.KVGroupSpec`, `kv_groups`
    in the order of `GroupedKV.groups`): `create_kv_cache` returns a `GroupedKV` over them and
    `forward` reads each group's blocks through `ForwardBatch.group_table(g)` (a state
    group's: `[rows, 1]`, each row's slot).

    Sizing: every full group has `num_blocks` blocks (a periodic one, `KVGroupSpec.period`,
    its share of them: `openinfer_kvcache.periodic_pool_blocks`), and
    `Model.kv_bytes_per_block` is one block of all of them. The line sizes its window and
    state groups' pools itself, for the step limits (`openinfer_kvcache.group_pool_blocks`: a
    state group gets `max_num_seqs + 1` slots), and `kv_window_bytes` says what they take (and
    any fixed part of a periodic pool): the memory budget sets that aside first and gives the
    full groups the rest. Without the capability a model has one full group.

    A model with a state group has no prefix cache (`GroupedKV`): the engine turns prefix
    caching off for it. `--kv-offload` is refused for a model with a state group (a slot
    holds no per-block copy to save); with window groups it needs `SupportsKVGroupOffload`."""

    kv_groups: tuple[KVGroupSpec, ...]

    def kv_window_bytes(self, block_size: int, limits: KVStepLimits) -> int:
        """Device bytes of every pool but the full groups' (window groups' blocks and state
        groups' slots) that `create_kv_cache(..., limits)` allocates. Pure."""
        ...

    def create_kv_cache(self, num_blocks: int, block_size: int,
                        limits: KVStepLimits | None = None) -> KVManager:
        """`Model.create_kv_cache`, the full groups of `num_blocks` blocks and the window and
        state groups' pools sized for `limits`; None: start-up's scratch caches, `num_blocks`
        in every token group and `min(num_blocks, kv.SCRATCH_STATE_SLOTS)` slots in a state
        group (`group_pool_blocks` gives both). A scratch batch has no `group_block_tables`
        (every group uses the full group's block ids), unless the model has a state group: then
        it has them, the token groups' being `block_tables` and a state group's
        `engine.batch.scratch_group_tables`' slots, all below `SCRATCH_STATE_SLOTS`."""
        ...


def supports_kv_groups(model: object) -> TypeIs[SupportsKVGroups]:
    return isinstance(model, SupportsKVGroups)


def create_kv_cache_of(model: Model, num_blocks: int, block_size: int,
                       limits: KVStepLimits | None) -> KVManager:
    """`model.create_kv_cache`, given `limits` where the model has KV groups."""
    if limits is not None and supports_kv_groups(model):
        return model.create_kv_cache(num_blocks, block_size, limits)
    return model.create_kv_cache(num_blocks, block_size)


def kv_groups_of(model: object) -> tuple[KVGroupSpec, ...]:
    """The model's KV groups: none without `SupportsKVGroups` (one full group)."""
    return model.kv_groups if supports_kv_groups(model) else ()


def side_groups_of(model: object) -> tuple[KVGroupSpec, ...]:
    """The model's window and state KV groups (every group but the full ones)."""
    return tuple(g for g in kv_groups_of(model) if not g.is_full)


def has_state_groups(model: object) -> bool:
    """Whether the model keeps a recurrent state per request (a state KV group)."""
    return any(g.state for g in kv_groups_of(model))


@runtime_checkable
class SupportsPooling(Protocol):
    """A model that can return hidden states instead of logits: what an engine started with
    task `embed` needs (pooling requests). `pooling_hidden_size` is 0 where it cannot after all
    (a tensor-parallel wrapper around a shard without this capability). Without it, task
    `embed` is refused at start."""

    pooling_hidden_size: int

    def forward_hidden(self, batch: ForwardBatch) -> torch.Tensor:
        """The step's forward, writing KV as `forward` does, returning the final-normed
        hidden states `[len(batch.logits_indices), pooling_hidden_size]` (fp32) at
        `logits_indices` instead of logits. Under tensor parallelism every rank runs it and
        rank 0's return value is the whole vector."""
        ...


def supports_pooling(model: object) -> TypeIs[SupportsPooling]:
    return isinstance(model, SupportsPooling) and model.pooling_hidden_size > 0


@runtime_checkable
class SupportsClose(Protocol):
    """A model that started something to stop (tensor-parallel worker processes)."""

    def close(self) -> None:
        """Stop what the model started; idempotent. Engine thread, or after it stopped."""
        ...


def supports_close(model: object) -> TypeIs[SupportsClose]:
    return isinstance(model, SupportsClose)


@runtime_checkable
class SupportsStarted(Protocol):
    """A model with processes of its own beside the engine's (tensor-parallel ranks), told
    when start-up is done: from then on each logs the kernels it compiles late
    (`late_compiles.py`), as the engine's process does."""

    def started(self) -> None: ...


def supports_started(model: object) -> TypeIs[SupportsStarted]:
    return isinstance(model, SupportsStarted)


@runtime_checkable
class SupportsCompileAhead(Protocol):
    """A model whose `forward` may run with its kernels' launches skipped
    (`interfaces.kernel_compiler.KernelCompiler.compiling()`): it takes no host decision from
    what a kernel wrote (no data-dependent shapes or indexing), so such a pass meets the same
    kernel variants as a real one, and its outputs, thrown away, do no harm. On a cold start
    start-up then compiles every kernel it will run in one parallel round
    (`openinfer_core.startup.compile_round`). Without it each kernel compiles at its first
    launch, one after the other."""

    compile_ahead_safe: bool


def supports_compile_ahead(model: object) -> TypeIs[SupportsCompileAhead]:
    return isinstance(model, SupportsCompileAhead) and model.compile_ahead_safe is True


# -- model lines (classes) --------------------------------------------------------------------
@runtime_checkable
class SupportsTensorParallel(Protocol):
    """A model line whose `load` honours `LoadOptions.tensor_parallel`: it loads one rank's
    shard, the returned model's `kv_bytes_per_block` is rank 0's (no rank's shard is larger),
    and its `forward` returns the full-vocabulary logits on every rank.
    `--tensor-parallel-size N` is refused for other lines."""

    supports_tensor_parallel: ClassVar[Literal[True]]


def supports_tensor_parallel(line: object) -> TypeIs[SupportsTensorParallel]:
    return isinstance(line, SupportsTensorParallel) and line.supports_tensor_parallel is True


@runtime_checkable
class SupportsExpertParallel(Protocol):
    """A model line with routed experts that honours `LoadOptions.expert_parallel`: each
    expert lives whole on one rank (`--enable-expert-parallel`, refused for other lines)."""

    supports_expert_parallel: ClassVar[Literal[True]]


def supports_expert_parallel(line: object) -> TypeIs[SupportsExpertParallel]:
    return isinstance(line, SupportsExpertParallel) and line.supports_expert_parallel is True


@runtime_checkable
class SupportsOnlineQuantization(Protocol):
    """A model line that quantizes an unquantized checkpoint's weights at load
    (`LoadOptions.quantization`, `--quantization`) by the methods it names; `--quantization`
    is refused for other lines and methods."""

    online_quantization: ClassVar[frozenset[str]]


def supports_online_quantization(line: object, method: str
                                 ) -> TypeIs[SupportsOnlineQuantization]:
    return (isinstance(line, SupportsOnlineQuantization)
            and method in line.online_quantization)


# -- schedulers -------------------------------------------------------------------------------
@runtime_checkable
class SupportsOffload(Protocol):
    """A scheduler that restores offloaded prefixes at admission (`--kv-offload`): the engine
    hands it the restorer once, before the first step. Without it `--kv-offload` is refused."""

    def attach_offload(self, offload: PrefixRestorer) -> None:
        """Use `offload` at admission from now on. Called once, on the engine thread."""
        ...


def supports_offload(scheduler: object) -> TypeIs[SupportsOffload]:
    return isinstance(scheduler, SupportsOffload)


@runtime_checkable
class SupportsFp8KVCache(Protocol):
    """A model line whose `load` honours `LoadOptions.kv_cache_dtype` float8_e4m3fn: its KV
    pages are e4m3 with per-tensor scales (`AttentionBackend.attend`). `--kv-cache-dtype fp8`
    is refused for other lines."""

    supports_fp8_kv_cache: ClassVar[Literal[True]]


def supports_fp8_kv_cache(line: object) -> TypeIs[SupportsFp8KVCache]:
    return isinstance(line, SupportsFp8KVCache) and line.supports_fp8_kv_cache is True
