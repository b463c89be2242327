"""The tensor-parallel process group over torch.distributed: NCCL on CUDA, gloo on CPU.

Each rank's process joins the default process group through a file store in a folder the
launcher made (one host), or a TCP store that rank 0 hosts (several nodes, `nodes.py`); every
collective inherits the group's timeout, so no wait is unbounded. One group per process at a
time: `close()` before building another."""

from __future__ import annotations

import datetime
import logging
import os
import threading
from pathlib import Path

import torch
import torch.distributed as dist

from openinfer_core.distributed.add_norm import FusedAllReduceAddNorm, fused_norm_mode
from openinfer_core.distributed.all_reduce import SymmetricAllReduce
from openinfer_core.distributed.symmetric_add_norm import SymmetricAddNorm
from openinfer_core.interfaces.model import (
    PushAreas,
    SymmetricAddNormKernel,
    SymmetricIdsKernel,
    SymmetricLinearPushKernel,
    SymmetricPushAddNormKernel,
)

log = logging.getLogger("openinfer")

# An experiment, not a serving mode: "1" makes the model lines compute each rank's partial
# product of a row-split layer in fp32 and all-reduce it in fp32, so the sum is rounded to bf16
# once, as one GPU's GEMM rounds it (the tensor-parallel gate's `fp32-reduce` case).
FP32_REDUCE_ENV = "OPENINFER_TP_FP32_REDUCE"

GLOO_LEAVE_S = 30.0  # gloo's teardown is local and quick: this bounds a broken one


class TorchTensorParallelGroup:
    """`interfaces.model.TensorParallelGroup` over torch.distributed's default group.

    The collectives take device tensors and never synchronise the host with the device, so
    they are captured in the engine's CUDA graphs; `all_to_all` is the exception when it
    exchanges its counts. On CUDA, all-reduces small enough go through symmetric memory
    (`all_reduce.py`), the rest through NCCL. Engine thread only."""

    def __init__(self, rank: int, size: int, device: torch.device, store: Path | dist.Store,
                 timeout_s: float) -> None:
        self.rank = rank
        self.size = size
        self.device = device
        self.timeout_s = timeout_s
        backend = "nccl" if device.type == "cuda" else "gloo"
        if dist.is_initialized():
            raise RuntimeError("a torch.distributed process group already exists in this "
                               "process: close the other tensor-parallel model first")
        if isinstance(store, Path):
            store = dist.FileStore(str(store), size)
        # NCCL binds the group to one GPU and wants it indexed ("cuda" alone is refused).
        device_id = None
        if device.type == "cuda":
            device_id = torch.device("cuda", torch.cuda.current_device() if device.index is None
                                     else device.index)
        dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device_id)
        self._closed = False
        self.reduce_dtype: torch.dtype | None = (
            torch.float32 if os.environ.get(FP32_REDUCE_ENV) == "1" else None)
        self._symmetric = SymmetricAllReduce.open(size, device) if size > 1 else None
        self._fused: FusedAllReduceAddNorm | SymmetricAddNorm | None = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the ranks: x itself summed in place (NCCL, gloo) or a new tensor
        (symmetric memory; a decode step's few rows of the fused norm's width: pushed, by the
        push kernel's sum-only form); x's contents are undefined after."""
        if isinstance(self._fused, SymmetricAddNorm) and x.is_cuda:
            pushed = self._fused.reduce(x)
            if pushed is not None:
                return pushed
        if self._symmetric is not None and x.is_cuda:
            path = self._symmetric.path(x)
            if path != "nccl":
                return self._symmetric(x, path)
        dist.all_reduce(x)
        return x

    def enable_add_rms_norm(self, hidden: int, dtype: torch.dtype,
                            kernel: SymmetricAddNormKernel | None = None,
                            push_kernel: SymmetricPushAddNormKernel | None = None,
                            linear_kernel: SymmetricLinearPushKernel | None = None,
                            ids_kernel: SymmetricIdsKernel | None = None) -> None:
        """Set up the fused all-reduce + add + RMSNorm for rows of `hidden` values of `dtype`
        where it is asked for and available: FlashInfer's (`add_norm.py`) or the line's
        `kernel` over symmetric memory (`symmetric_add_norm.py`), with the push kernel (and the
        line's linear that pushes its own rows, `linear`), by `OPENINFER_TP_FUSED_NORM`, and
        with the push kernel the line's `ids_kernel` for `broadcast`'s token ids.
        Collective: every rank, at load, outside CUDA graph capture."""
        if self.size == 1 or self._fused is not None:
            return
        mode = fused_norm_mode(self.size)
        if mode == "flashinfer":
            self._fused = FusedAllReduceAddNorm.open(self.rank, self.size, self.device, hidden,
                                                     dtype)
        elif mode in ("triton", "push", "linear") and self.device.type == "cuda":
            self._fused = SymmetricAddNorm.open(
                self._symmetric, kernel, hidden, dtype, self.device,
                push_kernel if mode != "triton" else None,
                linear_kernel if mode == "linear" else None, ids_kernel)

    def all_reduce_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor,
                                weight: torch.Tensor,
                                eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rms_norm(sum + residual) * weight, sum + residual) in one kernel, `sum` the sum of
        `x` over the ranks; None (nothing done) where the fused kernel does not take `x`."""
        if self._fused is None or not self._fused.fits(x):  # (it exists on CUDA only)
            return None
        return self._fused(x, residual, weight, eps)

    def linear_all_reduce_add_rms_norm(self, x: torch.Tensor, w: object,
                                       residual: torch.Tensor, weight: torch.Tensor,
                                       eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """See `interfaces.model.TensorParallelGroup.linear_all_reduce_add_rms_norm`."""
        if not isinstance(self._fused, SymmetricAddNorm):  # (it exists on CUDA only)
            return None
        return self._fused.project(x, w, residual, weight, eps)

    def push_areas(self, hidden: int, dtype: torch.dtype) -> PushAreas | None:
        """See `interfaces.model.TensorParallelGroup.push_areas`."""
        if not isinstance(self._fused, SymmetricAddNorm):
            return None
        return self._fused.push_areas(hidden, dtype)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty((self.size, *x.shape), dtype=x.dtype, device=x.device)
        if x.is_cuda:
            dist.all_gather_into_tensor(out, x)
        else:  # gloo has no all_gather_into_tensor
            dist.all_gather(list(out.unbind(0)), x)
        return out.movedim(0, -2).reshape(*x.shape[:-1], self.size * x.shape[-1])

    def all_to_all(self, x: torch.Tensor, send_counts: list[int],
                   recv_counts: list[int] | None = None) -> tuple[torch.Tensor, list[int]]:
        """See `interfaces.model.TensorParallelGroup.all_to_all`. gloo and NCCL both take
        uneven and empty parts."""
        if len(send_counts) != self.size or sum(send_counts) != x.shape[0]:
            raise ValueError(f"send_counts {send_counts} do not split {x.shape[0]} rows over "
                             f"{self.size} ranks")
        if recv_counts is None:
            sent = torch.tensor(send_counts, dtype=torch.int64, device=x.device)
            got = torch.empty_like(sent)
            dist.all_to_all_single(got, sent)
            recv_counts = got.tolist()
        out = x.new_empty((sum(recv_counts), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_counts, send_counts)
        return out, recv_counts

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """`x` from rank `src` on every rank, in place; returns `x`. A step's token ids from
        rank 0 are pushed where the push memory has room for them (`SymmetricAddNorm.
        broadcast_ids`: the caller's forward then meets every rank before its next call, as a
        model's all-reduces do), else NCCL's (or gloo's) broadcast."""
        if (src == 0 and x.is_cuda and isinstance(self._fused, SymmetricAddNorm)
                and self._fused.broadcast_ids(x)):
            return x
        dist.broadcast(x, src)
        return x

    def close(self, timeout_s: float = 10.0, abort: bool = False) -> None:
        """Leave the group (idempotent). NCCL's teardown waits for every rank of the node to
        tear down too: rank 0 calls this right after telling the workers to stop, and they call
        it on "stop", so the ranks leave together. It is bounded by `timeout_s`: past it (a
        rank that is gone or stuck never joins in) the teardown is left to a daemon thread and
        this process keeps its default group, so it cannot build another; it should end. After
        a failed collective the group may be broken: leaving it then is logged, not raised.
        `abort`: a rank is gone, so end the group's collectives rather than let them finish
        (NCCL, with torch's abort where it has one). gloo's teardown is local: it is always
        waited for, so that a next group can start in this process."""
        if self._closed:
            return
        self._closed = True
        if self._fused is not None:
            self._fused.close()
            self._fused = None
        if not dist.is_initialized():
            return
        nccl = self.device.type == "cuda"
        done = threading.Event()

        def leave() -> None:
            try:
                if nccl and abort and hasattr(dist.distributed_c10d, "_abort_process_group"):
                    dist.distributed_c10d._abort_process_group()
                else:
                    dist.destroy_process_group()
            except Exception as exc:  # a broken group: nothing left to do with it
                log.warning("leaving the tensor-parallel group failed: %s", exc)
            done.set()

        wait_s = timeout_s if nccl else max(timeout_s, GLOO_LEAVE_S)
        threading.Thread(target=leave, name="openinfer-tp-leave", daemon=True).start()
        if not done.wait(wait_s):
            log.warning("tensor parallel: rank %d could not leave the group within %.0f s (another "
                        "rank is gone or stuck); left to a background thread", self.rank, wait_s)
