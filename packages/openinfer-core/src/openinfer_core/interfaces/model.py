"""The model line: how a model family is loaded and run over a batch on paged KV."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch

from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.attention import AttentionBackend
from openinfer_core.interfaces.kv import KVManager


@dataclass(slots=True)
class ForwardBatch:
    """One step's tokens, flattened: prefill chunks and decode tokens of B requests, T tokens.

    Request b owns tokens `query_start_loc[b]:query_start_loc[b+1]`, at positions ending at
    `seq_lens[b] - 1`; its KV (including this step's) lives in blocks `block_tables[b]`.
    `logits_indices` picks the token rows whose next-token logits are needed.

    KV groups (`interfaces.kv.GroupedKV`, a model whose manager has several): `block_tables`
    and `slot_mapping` are the first full group's; `group_block_tables` holds every group's
    table, in `GroupedKV.groups` order, each `[B, max_blocks]` like `block_tables` (block i of
    every token group holds positions [i * block_size, (i + 1) * block_size); a window group's
    entries it no longer keeps are 0), a state group's `[B, 1]`: each row's slot (0, the
    padding slot, for padding rows). It is empty with one group, and in start-up's scratch
    batches, whose KV caches give every group the same blocks: `group_table(g)` answers
    `block_tables` then. A model with a state group gets it in every batch, scratch ones
    included (`engine.batch.scratch_group_tables`).

    The `*_cpu` fields, when set, are host copies of those fields (the engine has them before
    the device does): a backend that plans on the host reads them without waiting for the
    device. They are None in batches captured into CUDA graphs.

    `logits_out`, when set, is an fp32 buffer of at least `[len(logits_indices), vocab_size]`
    that the model may write its logits into (its first rows) and return a view of; CUDA
    graphs set it so that every captured graph shares one output. A model may ignore it.

    `host`, when set, is the engine's host image of the whole batch (`HostBatch`),
    which a tensor-parallel rank 0 sends to the other ranks instead of the device tensors.
    Whoever changes a field after `HostBatch.to_device` sets `host` to None (or changes the
    host image first)."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64, block_id * block_size + offset
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32, context length after this step
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0
    logits_indices: torch.Tensor  # [S] int64
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: torch.Tensor | None = None
    seq_lens_cpu: torch.Tensor | None = None
    block_tables_cpu: torch.Tensor | None = None
    logits_out: torch.Tensor | None = None
    host: HostBatch | None = None
    group_block_tables: tuple[torch.Tensor, ...] = ()  # [B, max_blocks] ([B, 1]) int32 each

    def group_table(self, group: int) -> torch.Tensor:
        """KV group `group`'s block tables (`GroupedKV.groups` order): `block_tables` where
        the batch has none per group."""
        return self.group_block_tables[group] if self.group_block_tables else self.block_tables

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])


@dataclass(slots=True)
class HostBatch:
    """The host image of a `ForwardBatch` (same fields, numpy arrays). With KV groups,
    `block_tables` is the first full group's entry of `group_block_tables` (the same array)."""

    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64
    query_start_loc: np.ndarray  # [B + 1] int32
    seq_lens: np.ndarray  # [B] int32
    block_tables: np.ndarray  # [B, width] int32
    logits_indices: np.ndarray  # [S] int64
    max_query_len: int
    max_seq_len: int
    group_block_tables: tuple[np.ndarray, ...] = ()  # [B, width] ([B, 1]) int32 each

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    def pending_tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """PENDING token slots (negative ids): their positions in the step, and the row each
        ends (a pending token is always the last token of its row). The slots are set to 0."""
        where = np.flatnonzero(self.input_ids < 0)
        if len(where):
            self.input_ids[where] = 0
        rows = np.searchsorted(self.query_start_loc, where, side="right") - 1
        return where, rows

    @property
    def is_decode(self) -> bool:
        """Every row runs exactly one token and samples: the shape CUDA graphs replay."""
        return self.max_query_len == 1 and len(self.logits_indices) == self.num_seqs

    def to_device(self, device: torch.device) -> ForwardBatch:
        def dev(a: np.ndarray) -> torch.Tensor:
            host = torch.from_numpy(a)
            if device.type == "cuda":
                # From pageable memory the copy would wait for the work already queued (the
                # step in flight, with overlapped steps); from pinned memory it does not.
                host = host.pin_memory()
            return host.to(device, non_blocking=True)

        block_tables = dev(self.block_tables)
        # The full group's table is `block_tables` itself: moved once.
        groups = tuple(block_tables if t is self.block_tables else dev(t)
                       for t in self.group_block_tables)
        return ForwardBatch(
            input_ids=dev(self.input_ids), positions=dev(self.positions),
            slot_mapping=dev(self.slot_mapping), query_start_loc=dev(self.query_start_loc),
            seq_lens=dev(self.seq_lens), block_tables=block_tables,
            logits_indices=dev(self.logits_indices), max_query_len=self.max_query_len,
            max_seq_len=self.max_seq_len,
            query_start_loc_cpu=torch.from_numpy(self.query_start_loc),
            seq_lens_cpu=torch.from_numpy(self.seq_lens),
            block_tables_cpu=torch.from_numpy(self.block_tables), host=self,
            group_block_tables=groups)

    @classmethod
    def of(cls, batch: ForwardBatch) -> HostBatch:
        """The host image of a device batch: `batch.host` where it has one, else its fields
        read back from the device (a synchronisation; start-up and tests only)."""
        known = batch.host
        if known is not None:
            if (len(known.input_ids), known.num_seqs, len(known.logits_indices),
                    known.block_tables.shape, len(known.group_block_tables)) != (
                        batch.num_tokens, batch.num_seqs, len(batch.logits_indices),
                        tuple(batch.block_tables.shape), len(batch.group_block_tables)):
                raise ValueError("ForwardBatch.host does not describe its batch: change the "
                                 "HostBatch before to_device(), or set host=None")
            return known

        def host(t: torch.Tensor) -> np.ndarray:
            return t.cpu().numpy()

        block_tables = host(batch.block_tables)
        groups = tuple(block_tables if t is batch.block_tables else host(t)
                       for t in batch.group_block_tables)
        return cls(
            input_ids=host(batch.input_ids), positions=host(batch.positions),
            slot_mapping=host(batch.slot_mapping), query_start_loc=host(batch.query_start_loc),
            seq_lens=host(batch.seq_lens), block_tables=block_tables,
            logits_indices=host(batch.logits_indices), max_query_len=batch.max_query_len,
            max_seq_len=batch.max_seq_len, group_block_tables=groups)


@runtime_checkable
class Model(Protocol):
    """A loaded model: owns its weights and its KV device buffer.

    What a model may offer beyond this (CUDA graphs, device sampling kernels, KV offload,
    compiling ahead, ...) it declares by implementing the protocols in
    `interfaces.capabilities`; the engine checks them with the `supports_*` helpers there."""

    vocab_size: int
    # Start-up may lower it once the KV cache is allocated, to what the cache holds
    # (startup/memory_budget.py, fit_max_model_len): a model serves a shorter length than it
    # was loaded for (its position tables are then longer than needed).
    max_model_len: int
    device: torch.device

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Device bytes one KV block takes over all layers (with KV groups: one block of every
        full group; `capabilities.SupportsKVGroups`). Pure."""
        ...

    def create_kv_cache(self, num_blocks: int, block_size: int) -> KVManager:
        """Allocate the KV device buffer (block 0 = padding) and return its block manager.
        Called before the first forward (start-up may call it before with scratch sizes; each
        call replaces the buffer). A model with KV groups takes the step limits as a third
        argument (`capabilities.SupportsKVGroups.create_kv_cache`)."""
        ...

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Run all tokens of `batch`, writing their KV; return fp32 logits
        `[len(batch.logits_indices), vocab_size]`."""
        ...


class ModelFailedError(RuntimeError):
    """Raised by `Model.forward` when the model cannot run any further step (a
    tensor-parallel rank died or a collective failed or timed out): unlike any other forward
    error, which fails only its batch, the engine ends every request with an error and stops."""


class SymmetricAddNormKernel(Protocol):
    """A kernel that sums a row-split layer's partial products over the ranks through symmetric
    memory and adds the residual and normalizes in the same launch
    (`openinfer_kernels.collective.all_reduce_add_rms_norm`): a model line hands it to
    `TensorParallelGroup.enable_add_rms_norm`, since core does not import kernels. Collective:
    every rank calls it with the same shapes, in the same order as its other collectives."""

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float, buffers: Sequence[torch.Tensor], pads: Sequence[torch.Tensor],
                 rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(s + residual) * weight, s + residual) in new tensors, `s` the sum of `x`
        over the ranks; `buffers` / `pads`: every rank's symmetric buffer (as x's dtype) and
        signal pad (int32, left at 0), in rank order; `rank`: this one's index."""
        ...


class SymmetricPushAddNormKernel(Protocol):
    """The same sum, add and norm for a decode step's few rows, pushing each rank's rows into
    its peers' memory (`openinfer_kernels.collective.all_reduce_add_rms_norm_push`): its own
    symmetric region, which the group allocates by the sizes the kernel gives. Collective as
    `SymmetricAddNormKernel`."""

    max_rows: int  # the most rows one call takes
    area_fill: int  # the byte every landing area holds before the first call (flags: zeros)
    takes_shares: bool  # whether `reduce_shares` works (else it answers None)

    def area_elements(self, world: int, hidden: int) -> int:
        """The elements (x's dtype) of one rank's landing area."""
        ...

    def flag_slots(self, world: int) -> int:
        """The int32 flags of one rank."""
        ...

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float, areas: Sequence[torch.Tensor], flags: Sequence[torch.Tensor],
                 seqs: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """As `SymmetricAddNormKernel`; `areas` / `flags`: every rank's landing area (bytes of
        `area_fill` before the first call) and flags (zeros), in rank order; `seqs`: this
        rank's int32 call counts, `max_rows` of them (zeros at first)."""
        ...

    def all_reduce(self, x: torch.Tensor, areas: Sequence[torch.Tensor], seqs: torch.Tensor,
                   rank: int) -> torch.Tensor | None:
        """The sum over the ranks of x [T, hidden] alone (T <= `max_rows`), in a new tensor,
        over the same memory and counts as the calls above (they interleave); None, nothing
        done, where this kernel has no such form (the same answer on every rank)."""
        ...

    def reduce_shares(self, shares: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float, areas: Sequence[torch.Tensor], flags: Sequence[torch.Tensor],
                      seqs: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The call above with the rank's rows given as a split-K linear's fp32 shares
        [S, T, hidden], summed in share order and rounded to residual's dtype first; None,
        nothing done, where this kernel has no such form (the same answer on every rank)."""
        ...


class SymmetricIdsKernel(Protocol):
    """Rank 0's token ids pushed onto every rank through symmetric memory at a step's start
    (`openinfer_kernels.collective.push_ids`), in place of a broadcast: its own int32 slots in
    the push kernel's region. Collective: every rank calls it with the same length, and the
    forward after it meets every rank (an all-reduce) before its next call."""

    slots: int  # int32 slots of one rank's landing area
    programs: int  # int32 call counts of one rank
    fill: int  # the byte every slot holds before the first call

    def __call__(self, ids: torch.Tensor, areas: Sequence[torch.Tensor], seqs: torch.Tensor,
                 rank: int) -> bool:
        """Rank 0's `ids` (1-D, int32 or int64) in place on every rank; False, nothing done,
        where they do not fit (the same answer on every rank). `areas`: every rank's slots,
        in rank order; `seqs`: this rank's call counts (zeros at first)."""
        ...


class SymmetricLinearPushKernel(Protocol):
    """A row-split linear layer and the push kernel's sum, add and norm in one launch, for a
    decode step's few rows (`openinfer_kernels.collective.linear_push_add_rms_norm`): each
    rank's product pushes itself into the peers' landing areas, the push kernel's memory and
    protocol (same `area_fill`), so no all-reduce kernel follows the product."""

    max_rows: int  # the most rows one call takes
    area_fill: int  # the landing areas' empty byte: must be the push kernel's

    def __call__(self, x: torch.Tensor, w: object, residual: torch.Tensor,
                 weight: torch.Tensor, eps: float, areas: Sequence[torch.Tensor],
                 seqs: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rms_norm(s + residual) * weight, s + residual), s the sum over the ranks of
        x @ w.T (this rank's shard `w` [H, K], in the line's own weight type); None, nothing
        done, where it does not take this weight or shape (the same answer on every rank).
        `areas`, `seqs`: as `SymmetricPushAddNormKernel`'s."""
        ...


@dataclass(frozen=True, slots=True)
class PushAreas:
    """The group's push memory, for a line's own kernels that push a decode step's rows the way
    `SymmetricPushAddNormKernel` does (one program a row, `seqs[row]` its call count, two
    parities of landing slots), so their calls interleave with the group's on the same memory:
    every rank's landing area in rank order, this rank's call counts and index, the most rows a
    call takes, and the byte an empty landing area holds (the kernel's `area_fill`: how its
    rows signal that they landed)."""

    areas: tuple[torch.Tensor, ...]
    seqs: torch.Tensor
    rank: int
    max_rows: int
    area_fill: int


@runtime_checkable
class TensorParallelGroup(Protocol):
    """The ranks a tensor-parallel model is split over, as its model line sees them: each
    rank's `forward` runs the same batch and calls these collectives in the same order. Every
    call blocks until all ranks made it, or raises when a rank died or the group's timeout
    passed. Implemented by `openinfer_core.distributed.TorchTensorParallelGroup`."""

    rank: int  # 0 .. size - 1; rank 0 is the engine's process and returns the logits
    size: int
    # The dtype a row-split layer's partial products are summed in: None, the model's own;
    # float32 in the tensor-parallel gate's experiment (`distributed.group.FP32_REDUCE_ENV`).
    reduce_dtype: torch.dtype | None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of `x` over the ranks: `x` summed in place or a new tensor (use the
        returned one; `x`'s contents are undefined after)."""
        ...

    def enable_add_rms_norm(self, hidden: int, dtype: torch.dtype,
                            kernel: SymmetricAddNormKernel | None = None,
                            push_kernel: SymmetricPushAddNormKernel | None = None,
                            linear_kernel: SymmetricLinearPushKernel | None = None,
                            ids_kernel: SymmetricIdsKernel | None = None) -> None:
        """Let `all_reduce_add_rms_norm` fuse for rows of `hidden` values of `dtype` where the
        group can (collective: every rank calls it at load, outside CUDA graph capture).
        `kernel`: the line's kernel over symmetric memory, which the group may use instead of
        its own (`OPENINFER_TP_FUSED_NORM=triton`); `push_kernel`: the line's push form for
        few rows (`OPENINFER_TP_FUSED_NORM=push`, `kernel` past its rows); `linear_kernel`:
        the row-split linear fused with the push form (`OPENINFER_TP_FUSED_NORM=linear`, for
        `linear_all_reduce_add_rms_norm`); `ids_kernel`: the step's token ids pushed from rank
        0 in the push form's memory instead of broadcast (`OPENINFER_TP_IDS=push`, the
        default where the push form is open)."""
        ...

    def all_reduce_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor,
                                weight: torch.Tensor,
                                eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rms_norm(s + residual) * weight, s + residual), s the sum of `x` over the ranks, in
        one kernel; or None, nothing done, where the group has no fused kernel for `x` (then
        `all_reduce` and the line's own norm). Every rank gets the same answer for the same
        shape. `x` [T, hidden], or a split-K linear's fp32 shares of it [S, T, hidden]
        (`openinfer_kernels.gemm.linear_shares`: their in-order sum rounded to residual's dtype
        is the rank's partial), which only the push kernel takes."""
        ...

    def linear_all_reduce_add_rms_norm(self, x: torch.Tensor, w: object,
                                       residual: torch.Tensor, weight: torch.Tensor,
                                       eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`all_reduce_add_rms_norm` of x @ w.T (`w` this rank's shard of a row-split layer) with
        the product in the same launch; None, nothing done, where the group has no such kernel
        for these rows and this weight (then the line's product and
        `all_reduce_add_rms_norm`). Every rank gets the same answer for the same shapes."""
        ...

    def push_areas(self, hidden: int, dtype: torch.dtype) -> PushAreas | None:
        """The push memory that `enable_add_rms_norm` opened for rows of `hidden` values of
        `dtype`, or None (none open, or for another width or dtype): the same answer on every
        rank."""
        ...

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` (same shape on all ranks), concatenated along the last dim in rank
        order: [..., size * x.shape[-1]]."""
        ...

    def all_to_all(self, x: torch.Tensor, send_counts: list[int],
                   recv_counts: list[int] | None = None) -> tuple[torch.Tensor, list[int]]:
        """Exchange rows: x [R, ...] holds, in rank order, `send_counts[r]` rows for each rank
        r (sum = R; zero is fine). Returns the rows received, in rank order (the rows from rank
        r are `recv_counts[r]` of them, in the order r sent them), and `recv_counts`. Without
        `recv_counts` the ranks first exchange their counts (on the GPU that reads them back to
        the host: a sync); a reply along the same routes passes the counts it received.
        For a line whose expert parallelism moves rows between ranks (none in this repository
        does: DeepSeek-V4's sums each rank's experts' part in its sublayer's all-reduce)."""
        ...


@dataclass(frozen=True, slots=True)
class LoadOptions:
    device: torch.device
    dtype: torch.dtype
    attention: AttentionBackend
    max_model_len: int | None = None
    load_format: str = "safetensors"  # or "dummy": random weights at the config's shapes
    # Quantize the linears at load (`--quantization`, e.g. "fp8"); None: as stored. Only lines
    # with `capabilities.SupportsOnlineQuantization` for that method are given one.
    quantization: str | None = None
    # Set: load only this rank's shard (`openinfer_core.distributed.sharding` says which
    # slices) and make `forward` run the collectives; only lines with
    # `capabilities.SupportsTensorParallel` are given one.
    tensor_parallel: TensorParallelGroup | None = None
    # With `tensor_parallel`: split the routed experts over the ranks whole instead of
    # splitting every expert's width (how the ranks combine their experts' outputs is the
    # line's). Only lines with `capabilities.SupportsExpertParallel`.
    expert_parallel: bool = False
    # The KV pages' dtype: None, the model's `dtype`; float8_e4m3fn (`--kv-cache-dtype fp8`)
    # only for lines with `capabilities.SupportsFp8KVCache`.
    kv_cache_dtype: torch.dtype | None = None

    def model_len(self, max_position_embeddings: int) -> int:
        """The context length to serve: `max_model_len`, or the model's
        `max_position_embeddings` where unset; a longer `max_model_len` than the model's is a
        `ModelConfigError`."""
        max_len = self.max_model_len or max_position_embeddings
        if max_len > max_position_embeddings:
            raise ModelConfigError(
                f"max_model_len {max_len} exceeds the model's max_position_embeddings "
                f"{max_position_embeddings}")
        return max_len


@runtime_checkable
class ModelLine(Protocol):
    """A model family. Registered through `openinfer_register_models` as `"module:Class"`.

    Tensor and expert parallelism are capabilities of the class
    (`capabilities.SupportsTensorParallel`, `SupportsExpertParallel`)."""

    name: ClassVar[str]

    @classmethod
    def load(cls, model_dir: Path, config: dict[str, Any], options: LoadOptions) -> Model:
        """Validate `config` (raising `ModelConfigError` naming the bad field), load weights
        (raising `WeightLoadError` naming the tensor) and return a ready model."""
        ...
