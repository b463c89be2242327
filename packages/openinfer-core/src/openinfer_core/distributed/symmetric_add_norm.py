"""All-reduce + residual add + RMSNorm in one kernel of our own, over the group's symmetric
memory (`OPENINFER_TP_FUSED_NORM=triton`): the one-shot all-reduce's
buffer and signal pads (`all_reduce.py`), read by
`openinfer_kernels.collective.all_reduce_add_rms_norm`.

Core does not import kernels: the model line hands the kernel in at load
(`TensorParallelGroup.enable_add_rms_norm(..., kernel=...)`), and this holds it with what it
needs, every rank's buffer and pad as this rank maps them. The buffer is shared with the
all-reduce paths; every collective on it, ours and torch's, meets the peers before it writes
the buffer and again before it returns, in stream order, so they never overlap. A step takes it
up to `MAX_ROWS` rows (and while they fit the buffer); larger steps take the unfused path.

`OPENINFER_TP_FUSED_NORM=push` adds the line's push kernel for steps of up to its `max_rows`
rows: it writes each rank's rows into its peers' memory and raises flags there (no meeting
before or after), in a symmetric region of its own that `PushMemory` allocates in the same
group (emptied on every rank before any call). It is the default on 2 and 4 ranks. On 2 ranks
larger steps take the one-shot kernel; on more, the unfused path: there the one-shot kernel
lost to it at every size (`PULL_RANKS`). The same memory serves the group's plain all-reduce
of such rows (`reduce`: the push kernel's sum-only form, rows of `hidden` only), for the
layers that add no norm after it (DeepSeek-V4's, whose hyper-connections follow), and with
the line's ids kernel, slots of its own where rank 0 pushes a step's token ids
(`broadcast_ids`; `OPENINFER_TP_IDS=nccl` keeps NCCL's broadcast)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from openinfer_core.distributed.add_norm import rows_fit
from openinfer_core.distributed.all_reduce import SymmetricAllReduce, SymmetricPeers, every_rank
from openinfer_core.interfaces.model import (
    PushAreas,
    SymmetricAddNormKernel,
    SymmetricIdsKernel,
    SymmetricLinearPushKernel,
    SymmetricPushAddNormKernel,
)

log = logging.getLogger("openinfer")

IDS_ENV = "OPENINFER_TP_IDS"  # push (default) | nccl: how a step's token ids leave rank 0

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Past this many rows the one-shot kernel (every rank reads every peer's whole partial) stops
# beating the two-shot all-reduce + add-norm: 28.1 vs 32.5 us at 512 rows of 4096, even at
# 1024, 106 vs 92 us at 2048 (`benchmarks/device/add_norm.py --fused triton`, 2 x H200).
MAX_ROWS = 512
# Group sizes where the one-shot kernel also takes the steps past the push kernel's rows. On 4
# ranks it lost to the unfused path at every size, 16.7 vs 9.1 us at one row of 4096 and 68.8
# vs 38.3 at 512, while the push kernel won up to its 64 rows, 7.8 and 13.5 us
# (`benchmarks/device/add_norm.py --gpus 4 --fused triton,push`, 4 x H200).
PULL_RANKS = (2,)


@dataclass(frozen=True, slots=True)
class PushMemory:
    """The push kernel's symmetric region as this rank maps it: every rank's landing area and
    flags, in rank order, and this rank's call counts."""

    kernel: SymmetricPushAddNormKernel
    areas: tuple[torch.Tensor, ...]
    flags: tuple[torch.Tensor, ...]
    seqs: torch.Tensor
    handle: Any  # the rendezvous' _SymmetricMemory: keeps the peers' mappings alive
    # With an ids kernel: every rank's int32 id slots and this rank's call counts for them.
    ids: SymmetricIdsKernel | None = None
    id_slots: tuple[torch.Tensor, ...] = ()
    id_seqs: torch.Tensor | None = None

    @classmethod
    def open(cls, kernel: SymmetricPushAddNormKernel, symmetric: SymmetricAllReduce,
             hidden: int, dtype: torch.dtype, device: torch.device,
             ids: SymmetricIdsKernel | None = None) -> PushMemory | None:
        """Allocated, mapped and emptied on every rank (areas of `kernel.area_fill` bytes,
        flags zero, id slots of `ids.fill` bytes), or None on every rank alike."""
        world = symmetric.size
        area_bytes = kernel.area_elements(world, hidden) * dtype.itemsize
        flags_at = -(-area_bytes // 256) * 256  # the flags start on a 256-byte boundary
        ids_at = -(-(flags_at + 4 * kernel.flag_slots(world)) // 256) * 256  # and the ids
        total = ids_at + (4 * ids.slots if ids is not None else 0)
        made, why = None, ""
        try:
            import torch.distributed._symmetric_memory as symm_mem

            region = symm_mem.empty(total, dtype=torch.uint8, device=device)
            handle = symm_mem.rendezvous(region, symmetric.group_name)  # type: ignore[arg-type]
            region.zero_()
            region[:area_bytes].fill_(kernel.area_fill)  # the landing areas' empty state
            whole = [handle.get_buffer(r, [total], torch.uint8) for r in range(world)]
            id_slots: tuple[torch.Tensor, ...] = ()
            id_seqs: torch.Tensor | None = None
            if ids is not None:
                region[ids_at:].fill_(ids.fill)  # the id slots' empty state
                id_slots = tuple(w[ids_at:].view(torch.int32) for w in whole)
                id_seqs = torch.zeros(ids.programs, dtype=torch.int32, device=device)
            made = cls(kernel, tuple(w[:area_bytes].view(dtype) for w in whole),
                       tuple(w[flags_at:ids_at].view(torch.int32) for w in whole),
                       torch.zeros(kernel.max_rows, dtype=torch.int32, device=device), handle,
                       ids, id_slots, id_seqs)
            torch.cuda.synchronize(device)  # emptied before any peer may write
        except Exception as exc:  # no second rendezvous in this group: the pull kernel alone
            why = f"{type(exc).__name__}: {exc}"
            made = None
        # Also the barrier after the emptying: no rank pushes before every rank has emptied.
        if not every_rank(made is not None, device):
            log.warning("tensor parallel: the push all-reduce + add + RMSNorm is unavailable "
                        "(%s); every step takes the one-shot kernel", why or "another rank "
                        "failed")
            return None
        return made


class SymmetricAddNorm:
    """The kernel, every rank's buffer and pad, and the rows they hold; with `push`, the push
    kernel's memory, for steps of up to its `max_rows` rows. Build with `open` (collective:
    every rank of the group at once, outside CUDA graph capture)."""

    def __init__(self, kernel: SymmetricAddNormKernel, peers: SymmetricPeers, hidden: int,
                 dtype: torch.dtype, max_rows: int, push: PushMemory | None = None,
                 linear: SymmetricLinearPushKernel | None = None) -> None:
        self.kernel = kernel
        self.peers = peers
        self.hidden = hidden
        self.dtype = dtype
        self.max_rows = max_rows
        self.push = push
        self.linear = linear if push is not None else None

    @classmethod
    def open(cls, symmetric: SymmetricAllReduce | None, kernel: SymmetricAddNormKernel | None,
             hidden: int, dtype: torch.dtype, device: torch.device,
             push_kernel: SymmetricPushAddNormKernel | None = None,
             linear_kernel: SymmetricLinearPushKernel | None = None,
             ids_kernel: SymmetricIdsKernel | None = None) -> SymmetricAddNorm | None:
        """Ready on every rank, or None on every rank alike (no symmetric memory, no kernel
        handed in, a dtype or width the buffer cannot take, or any rank failing to map it).
        `push_kernel`: also set up the push form (`PushMemory`), where it can be;
        `linear_kernel`: with it, the linear that pushes its own rows into the same memory
        (only where both start their landing areas alike); `ids_kernel`: with it too, slots
        for a step's token ids (unless `OPENINFER_TP_IDS=nccl`)."""
        # These answers are the same on every rank: no need to agree on them.
        if symmetric is None:
            return _unavailable("no symmetric memory")
        if kernel is None:
            return _unavailable("the model line passed no kernel (is triton installed?)")
        if dtype not in DTYPES:
            return _unavailable(f"{dtype} is not a float dtype")
        rows = min(MAX_ROWS, symmetric.buffer.numel() // (hidden * dtype.itemsize))
        if rows < 1:
            return _unavailable(f"rows of {hidden} do not fit the buffer")
        peers, why = None, ""
        try:
            peers = symmetric.peers(dtype)
            if peers.buffers[peers.rank].data_ptr() != symmetric.buffer.data_ptr():
                raise RuntimeError("torch maps this rank's buffer elsewhere than it allocated it")
            if peers.pads[peers.rank].numel() < symmetric.size:
                raise RuntimeError(f"a signal pad of {peers.pads[peers.rank].numel()} slots")
        except Exception as exc:  # an older torch: the unfused path
            why = f"{type(exc).__name__}: {exc}"
            peers = None
        if not every_rank(peers is not None, device):
            return _unavailable(why or "another rank failed")
        assert peers is not None
        push = None
        if push_kernel is not None:
            ids = ids_kernel if ids_mode() == "push" else None
            push = PushMemory.open(push_kernel, symmetric, hidden, dtype, device, ids)
            if symmetric.size not in PULL_RANKS:
                if push is None:  # (the same answer on every rank)
                    return _unavailable(f"no push memory, and the one-shot kernel loses on "
                                        f"{symmetric.size} ranks")
                rows = 0
        pulled = f"one-shot up to {rows} rows" if rows else "larger steps unfused"
        if linear_kernel is not None and (push is None
                                          or push.kernel.area_fill != linear_kernel.area_fill):
            log.warning("tensor parallel: the linear that pushes its own rows needs the push "
                        "kernel's memory with the rows as their signal "
                        "(OPENINFER_TP_PUSH_SIGNAL=data); the products run apart")
            linear_kernel = None
        log.info("tensor parallel: all-reduce + residual add + RMSNorm fused (Triton, symmetric "
                 "memory), rows of %d: %s%s", hidden,
                 f"pushed up to {push.kernel.max_rows} rows, {pulled}" if push else pulled,
                 f"; row-split linears push their own rows up to {linear_kernel.max_rows}"
                 if linear_kernel is not None else "")
        return cls(kernel, peers, hidden, dtype, rows, push, linear_kernel)

    def reduce(self, x: torch.Tensor) -> torch.Tensor | None:
        """The sum of `x` [T, hidden] over the ranks by the push kernel's sum-only form, or None
        where it does not take `x` (no push memory, more rows than it takes, another width or
        dtype, or a kernel without that form): the same answer on every rank."""
        push = self.push
        if (push is None or x.dim() != 2 or not 0 < x.shape[0] <= push.kernel.max_rows
                or x.shape[1] != self.hidden or x.dtype != self.dtype):
            return None
        return push.kernel.all_reduce(x, push.areas, push.seqs, self.peers.rank)

    def broadcast_ids(self, ids: torch.Tensor) -> bool:
        """Rank 0's token ids `ids` in place on every rank by the ids kernel; False, nothing
        done, where there is none or it does not take them (the same answer on every rank)."""
        push = self.push
        if push is None or push.ids is None or push.id_seqs is None:
            return False
        return push.ids(ids, push.id_slots, push.id_seqs, self.peers.rank)

    def push_areas(self, hidden: int, dtype: torch.dtype) -> PushAreas | None:
        """See `interfaces.model.TensorParallelGroup.push_areas`."""
        push = self.push
        if push is None or hidden != self.hidden or dtype != self.dtype:
            return None
        return PushAreas(push.areas, push.seqs, self.peers.rank, push.kernel.max_rows,
                         push.kernel.area_fill)

    def fits(self, x: torch.Tensor) -> bool:
        """Whether `x` [T, hidden] takes the kernel, or as split-K shares [S, T, hidden] fp32
        the push kernel (the same answer on every rank)."""
        pushed = self.push.kernel.max_rows if self.push is not None else 0
        if x.dim() == 3:
            return (x.dtype == torch.float32 and self.push is not None
                    and self.push.kernel.takes_shares
                    and rows_fit(x[0], self.hidden, torch.float32, pushed))
        return rows_fit(x, self.hidden, self.dtype, max(self.max_rows, pushed))

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(sum + residual) * weight, sum + residual), `sum` the sum of `x` (or of its
        shares' in-order sums) over the ranks; `fits(x)` must hold. New tensors: `x` and
        `residual` are left as they were."""
        push = self.push
        if x.dim() == 3:  # split-K shares (`fits` said the push kernel takes them)
            assert push is not None
            got = push.kernel.reduce_shares(x, residual, weight, eps, push.areas, push.flags,
                                            push.seqs, self.peers.rank)
            assert got is not None, "the push kernel refused shares it said it takes"
            return got
        if push is not None and x.shape[0] <= push.kernel.max_rows:
            return push.kernel(x, residual, weight, eps, push.areas, push.flags, push.seqs,
                               self.peers.rank)
        return self.kernel(x, residual, weight, eps, self.peers.buffers, self.peers.pads,
                           self.peers.rank)

    def project(self, x: torch.Tensor, w: object, residual: torch.Tensor, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`linear_kernel`'s (normed, summed) of x @ w.T, or None where there is none or it does
        not take these rows or this weight (the same answer on every rank)."""
        linear, push = self.linear, self.push
        if linear is None or push is None or not 0 < x.shape[0] <= linear.max_rows:
            return None
        return linear(x, w, residual, weight, eps, push.areas, push.seqs, self.peers.rank)

    def close(self) -> None:
        """Nothing to free: the buffer is the all-reduce's."""


def ids_mode() -> str:
    """`OPENINFER_TP_IDS`: how a step's token ids leave rank 0."""
    mode = os.environ.get(IDS_ENV, "push")
    if mode not in ("push", "nccl"):
        raise ValueError(f"{IDS_ENV}={mode!r}: use push or nccl")
    return mode


def _unavailable(why: str) -> SymmetricAddNorm | None:
    """None, `open`'s answer where the kernel cannot be used, once the log says why."""
    log.warning("tensor parallel: all-reduce + add + RMSNorm by Triton unavailable (%s); the "
                "all-reduce and the norm run apart", why)
    return None
