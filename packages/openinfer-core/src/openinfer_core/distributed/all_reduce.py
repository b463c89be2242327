"""The all-reduce each message size takes on CUDA: torch's symmetric-memory kernels over NVLink
for the small messages of decode steps, NCCL for the rest.

A decode step of Qwen3-8B all-reduces 73 messages of batch × 8 KB; NCCL takes 12.2-12.7 us for
each up to 64 KB, whatever its size (`benchmarks/device/all_reduce.py`, 2 H100s). torch's
symmetric memory (`torch.distributed._symmetric_memory`) maps every rank's staging buffer into
every other rank's address space, and its kernels read the peers' buffers directly over NVLink:

- one-shot: each rank reads all the others' whole buffers and sums (one barrier, size × (n-1)
  bytes read per rank): the least latency, for the smallest messages;
- two-shot: a reduce-scatter then an all-gather through the buffers (two barriers, 2 × size ×
  (n-1)/n bytes moved per rank): for the middle sizes.

Neither needs NVLink multicast (off on the lent machines). Both run inside CUDA graphs, and a
call stages its input into this rank's buffer (one copy), so callers keep their own tensors.
Which one a size takes is measured by `benchmarks/device/all_reduce.py` (BENCHMARKS.md,
"Tensor and data parallelism") and kept in `ONE_SHOT_MAX` / `TWO_SHOT_MAX`;
`OPENINFER_TP_ALL_REDUCE` forces one path for an A/B."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist

log = logging.getLogger("openinfer")

ALL_REDUCE_ENV = "OPENINFER_TP_ALL_REDUCE"  # auto (default) | nccl | one_shot | two_shot
Path_ = Literal["nccl", "one_shot", "two_shot"]

# The largest message (bytes) each path takes, by group size, from
# `benchmarks/device/all_reduce.py` on 2 H100s (NVLink, 386 GB/s peer copy), bf16 in CUDA
# graphs: one-shot is the fastest up to 1 MB (8.5 us at 8-64 KB against NCCL's 12.2-12.7),
# two-shot from 2 to 16 MB, NCCL from 32 MB. 4 GPUs were not lent: their values are untested
# guesses (a one-shot rank reads three peers there, so its crossover comes earlier).
ONE_SHOT_MAX = {2: 1 << 20, 4: 256 << 10}
TWO_SHOT_MAX = {2: 16 << 20, 4: 8 << 20}
DEFAULT_ONE_SHOT_MAX = 128 << 10  # group sizes not measured
DEFAULT_TWO_SHOT_MAX = 8 << 20
ALIGN_BYTES = 16  # two-shot splits the message into per-rank parts of whole 16-byte units

# Whether a group of this process set up symmetric memory already. torch keeps its
# symmetric-memory state per group name, and every default group is named "0": a later group
# in the same process would meet the first one's state (a second group's rendezvous never
# returned on 2 H100s). Only the first group of a process takes this path; the engine makes
# one per process, but a process that builds a second engine (a test comparing TP layouts)
# meets fresh workers: the ranks agree on it before any of them starts a rendezvous.
_opened_in_process = False


@dataclass(frozen=True, slots=True)
class SymmetricPeers:
    """Every rank's symmetric buffer and signal pad as this rank maps them, in rank order: what
    a kernel of our own reads and signals through (`symmetric_add_norm.py`). The pads are the
    ones torch's symmetric-memory kernels use, in the same layout (slot `block * size + rank`,
    0 between collectives): such a kernel must leave every slot at 0."""

    buffers: tuple[torch.Tensor, ...]  # the whole buffer of each rank, as one dtype
    pads: tuple[torch.Tensor, ...]  # the whole signal pad of each rank, int32
    rank: int


class SymmetricAllReduce:
    """One rank's symmetric-memory staging buffer and the rule that picks a path per message.
    Build with `open` (collective: every rank of the group at once)."""

    def __init__(self, buffer: torch.Tensor, group_name: str, size: int, forced: str,
                 handle: Any = None) -> None:
        self.buffer = buffer  # uint8, mapped into every rank
        self.handle = handle  # the rendezvous' _SymmetricMemory: the peers' mappings
        self.group_name = group_name
        self.size = size
        self.forced = forced
        self.one_shot_max = ONE_SHOT_MAX.get(size, DEFAULT_ONE_SHOT_MAX)
        self.two_shot_max = min(TWO_SHOT_MAX.get(size, DEFAULT_TWO_SHOT_MAX),
                                buffer.numel())

    @classmethod
    def open(cls, size: int, device: torch.device) -> SymmetricAllReduce | None:
        """This rank's part of the group's symmetric buffer, or None (on every rank alike)
        where symmetric memory is not usable or `OPENINFER_TP_ALL_REDUCE=nccl`."""
        forced = os.environ.get(ALL_REDUCE_ENV, "auto")
        if forced not in ("auto", "nccl", "one_shot", "two_shot"):
            raise ValueError(f"{ALL_REDUCE_ENV}={forced!r}: use auto, nccl, one_shot or "
                             "two_shot")
        if forced == "nccl" or device.type != "cuda":
            return None
        return cls._open_on(size, device, forced)

    @classmethod
    def _open_on(cls, size: int, device: torch.device,
                 forced: str) -> SymmetricAllReduce | None:
        """`open` past its checks of the path and the device (the CPU tests call it on gloo)."""
        global _opened_in_process
        # A rendezvous is collective: where one rank's process has set symmetric memory up
        # already (and so will not), no rank starts one (a rank in it would wait forever).
        if not every_rank(not _opened_in_process, device):
            log.warning("tensor parallel: a rank's process set up symmetric memory for an "
                        "earlier group; every all-reduce of this group goes through NCCL")
            return None
        group_name = dist.group.WORLD.group_name  # type: ignore[union-attr]
        nbytes = max(TWO_SHOT_MAX.get(size, DEFAULT_TWO_SHOT_MAX),
                     ONE_SHOT_MAX.get(size, DEFAULT_ONE_SHOT_MAX))
        buffer, handle = None, None
        why = ""
        try:
            import torch.distributed._symmetric_memory as symm_mem

            buffer = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
            handle = symm_mem.rendezvous(buffer, group_name)
            ops = torch.ops.symm_mem
            for name in ("one_shot_all_reduce_copy", "two_shot_all_reduce_out"):
                if not hasattr(ops, name):
                    raise RuntimeError(f"torch {torch.__version__} has no symm_mem.{name}")
        except Exception as exc:  # no NVLink peer access, an older torch: NCCL it is
            why = f"{type(exc).__name__}: {exc}"
            buffer = None
        # Every rank must take the same paths: agree that all of them have the buffer.
        if not every_rank(buffer is not None, device):
            log.warning("tensor parallel: symmetric-memory all-reduce unavailable (%s); every "
                        "all-reduce goes through NCCL", why or "another rank failed")
            return None
        assert buffer is not None
        _opened_in_process = True
        made = cls(buffer, group_name, size, forced, handle)
        log.info("tensor parallel: all-reduce by symmetric memory up to %d KB (one-shot up to "
                 "%d KB), NCCL past it%s", made.two_shot_max >> 10, made.one_shot_max >> 10,
                 "" if forced == "auto" else f" ({ALL_REDUCE_ENV}={forced})")
        return made

    def peers(self, dtype: torch.dtype) -> SymmetricPeers:
        """Every rank's whole buffer viewed as `dtype` and its whole signal pad as int32 (no
        sizes: torch gives the whole pad)."""
        numel = self.buffer.numel() // torch.empty(0, dtype=dtype).element_size()
        ranks = range(self.size)
        return SymmetricPeers(
            tuple(self.handle.get_buffer(r, [numel], dtype) for r in ranks),
            tuple(self.handle.get_signal_pad(r, [], torch.int32) for r in ranks),
            self.handle.rank)

    def path(self, x: torch.Tensor) -> Path_:
        """The path `x` takes: the same on every rank for the same shape and dtype."""
        nbytes = x.numel() * x.element_size()
        if nbytes > self.buffer.numel() or x.dtype not in (torch.bfloat16, torch.float16,
                                                            torch.float32):
            return "nccl"
        aligned = nbytes % (ALIGN_BYTES * self.size) == 0
        if self.forced == "one_shot":
            return "one_shot"
        if self.forced == "two_shot":
            return "two_shot" if aligned else "nccl"
        if nbytes <= self.one_shot_max:
            return "one_shot"
        if nbytes <= self.two_shot_max and aligned:
            return "two_shot"
        return "nccl"

    def __call__(self, x: torch.Tensor, path: Path_) -> torch.Tensor:
        """The sum of `x` over the ranks, in a new tensor of x's shape (`path` from `path`)."""
        flat = x.reshape(-1)
        staged = self.buffer[:flat.numel() * flat.element_size()].view(flat.dtype)
        if path == "one_shot":  # copies x into the buffer and sums in one kernel
            out = torch.ops.symm_mem.one_shot_all_reduce_copy(staged, flat, "sum",
                                                              self.group_name)
        else:
            staged.copy_(flat)
            out = torch.empty_like(flat)
            torch.ops.symm_mem.two_shot_all_reduce_out(staged, "sum", self.group_name, out)
        return out.view(x.shape)


def every_rank(has: bool, device: torch.device) -> bool:
    """Whether every rank of the default group says `has` (collective: all ranks at once), so
    that all take the same path after a setup that may fail on some."""
    ok = torch.tensor([int(has)], dtype=torch.int32, device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())
