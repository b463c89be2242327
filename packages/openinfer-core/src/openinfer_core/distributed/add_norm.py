"""All-reduce + residual add + RMSNorm in one kernel, for the row-split layers of a
tensor-parallel model line: FlashInfer's fusion (`flashinfer.comm.allreduce_fusion`, pattern
`kARResidualRMSNorm`, TensorRT-LLM's kernel).

Without it, a row-split layer under TP runs three steps: the ranks' partial products meet in an
all-reduce, then one kernel adds the residual and normalizes. Each of a decode step's 72
row-split all-reduces (o_proj and down of 36 layers; the embedding's is the 73rd) costs
~9.6 us, and each add + norm is another launch (Qwen3-8B TP2 on 2 H100s,
`decode_breakdown.py`). The fusion reads the peers' partials over NVLink and writes
`residual + sum` and its norm in the same kernel.

Its workspace is IPC memory that every rank maps (`create_allreduce_fusion_workspace`,
backend "trtllm"): POSIX file descriptors or fabric handles, exchanged over the group; no
NVLink multicast (off on the lent machines) and no MPI. It holds `MAX_TOKENS` rows: a larger
step takes the unfused path. The partials are summed in fp32.

`OPENINFER_TP_FUSED_NORM` picks the path: `triton`, our own kernel, one-shot over the
all-reduce's symmetric memory (`symmetric_add_norm.py`, no FlashInfer); `push`, the same with
a decode step's few rows pushed into the peers' memory instead; `flashinfer`, this one
(opt-in: its JIT build takes minutes at first start); `off`, neither. `auto` (the default) is
`push` on 2 and 4 ranks, where it was measured: Qwen3-8B batch-1 TPOT at TP2 2.85 ms (one-shot
2.99, unfused 3.17) and at TP4 2.31 ms (one-shot 2.89, unfused 2.47), the TP gate passing with
it (4 x H200, `TP_SIZES="1 2 4" gpu_check.sh tptriton`); `off` on other sizes until measured
there. `benchmarks/device/add_norm.py` times each beside the unfused path."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from openinfer_core.distributed.all_reduce import every_rank

log = logging.getLogger("openinfer")

# auto (default) | off | flashinfer | triton | push | linear (push, and the row-split linears
# pushing their own rows where the line's kernel takes them)
FUSED_NORM_ENV = "OPENINFER_TP_FUSED_NORM"
FUSED_NORM_MODES = ("auto", "off", "flashinfer", "triton", "push", "linear")
AUTO_PUSH_RANKS = (2, 4)  # group sizes where `auto` takes the push kernel: measured there
MAX_TOKENS = 2048  # rows the workspace holds (SGLang sizes it the same); larger steps: unfused


def fused_norm_mode(size: int) -> str:
    """`OPENINFER_TP_FUSED_NORM` for a group of `size` ranks: off, flashinfer, triton, push or
    linear (`auto`, the default, resolved by the group's size)."""
    mode = os.environ.get(FUSED_NORM_ENV, "auto")
    if mode not in FUSED_NORM_MODES:
        raise ValueError(f"{FUSED_NORM_ENV}={mode!r}: use auto, off, flashinfer, triton, push "
                         "or linear")
    if mode == "auto":
        return "push" if size in AUTO_PUSH_RANKS else "off"
    return mode


class FusedAllReduceAddNorm:
    """One rank's FlashInfer workspace for rows of `hidden` values of `dtype`. Build with
    `open` (collective: every rank of the group at once, outside CUDA graph capture)."""

    def __init__(self, workspace: Any, hidden: int, dtype: torch.dtype,
                 max_tokens: int) -> None:
        self.workspace = workspace
        self.hidden = hidden
        self.dtype = dtype
        self.max_tokens = max_tokens

    @classmethod
    def open(cls, rank: int, size: int, device: torch.device, hidden: int, dtype: torch.dtype,
             max_tokens: int = MAX_TOKENS) -> FusedAllReduceAddNorm | None:
        """The workspace on every rank, or None on every rank alike (not asked for, not on
        CUDA, FlashInfer missing or refusing these sizes, or any rank failing to set it up)."""
        if fused_norm_mode(size) != "flashinfer" or device.type != "cuda":
            return None
        workspace, why = None, ""
        try:
            from flashinfer.comm import create_allreduce_fusion_workspace

            if size not in (2, 4, 8, 16) or hidden % 8:
                raise ValueError(f"{size} ranks, hidden size {hidden}: the kernel takes 2, 4, "
                                 "8 or 16 ranks and rows of whole 16-byte vectors")
            workspace = create_allreduce_fusion_workspace(
                backend="trtllm", world_size=size, rank=rank, max_token_num=max_tokens,
                hidden_dim=hidden, dtype=dtype, group=dist.group.WORLD)
        except Exception as exc:  # no FlashInfer, no peer mapping: the unfused path
            why = f"{type(exc).__name__}: {exc}"
            workspace = None
        # Every rank must take the same path: agree that all of them have a workspace.
        if not every_rank(workspace is not None, device):
            log.warning("tensor parallel: fused all-reduce + add + RMSNorm unavailable (%s); "
                        "the all-reduce and the norm run apart", why or "another rank failed")
            if workspace is not None:
                _destroy(workspace)
            return None
        log.info("tensor parallel: all-reduce + residual add + RMSNorm fused (FlashInfer), up "
                 "to %d rows of %d", max_tokens, hidden)
        return cls(workspace, hidden, dtype, max_tokens)

    def fits(self, x: torch.Tensor) -> bool:
        """Whether `x` [T, hidden] takes the fused kernel (the same answer on every rank)."""
        return rows_fit(x, self.hidden, self.dtype, self.max_tokens)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(sum + residual) * weight, sum + residual), `sum` the sum of `x` over the
        ranks; `fits(x)` must hold. New tensors: `x` and `residual` are left as they were."""
        from flashinfer.comm import AllReduceFusionPattern, allreduce_fusion

        x = x.contiguous()
        normed, summed = torch.empty_like(x), torch.empty_like(x)
        # `output`, the bare sum, is a scratch this pattern does not fill (the library would
        # allocate it otherwise).
        allreduce_fusion(
            input=x, workspace=self.workspace, pattern=AllReduceFusionPattern.kARResidualRMSNorm,
            launch_with_pdl=False, trigger_completion_at_end=True, output=torch.empty_like(x),
            residual_in=residual.contiguous(), residual_out=summed, norm_out=normed,
            rms_gamma=weight, rms_eps=eps, use_oneshot=None, fp32_acc=True)
        return normed, summed

    def close(self) -> None:
        """Unmap the peers' buffers (before the group is left)."""
        _destroy(self.workspace)


def rows_fit(x: torch.Tensor, hidden: int, dtype: torch.dtype, max_rows: int) -> bool:
    """Whether `x` is [T, hidden] of `dtype` with 1 to `max_rows` rows: what a fused
    all-reduce + add + RMSNorm takes (the same answer on every rank)."""
    return x.dim() == 2 and x.shape[1] == hidden and x.dtype == dtype and 0 < x.shape[0] <= max_rows


def _destroy(workspace: Any) -> None:
    """Drop the library's own reference to the mapped buffers, then the workspace's."""
    # Best effort, each on its own: the process may be ending anyway.
    with contextlib.suppress(Exception):
        from flashinfer.comm.trtllm_ar import trtllm_destroy_ipc_workspace_for_all_reduce_fusion

        trtllm_destroy_ipc_workspace_for_all_reduce_fusion(workspace.ipc_handles)
    with contextlib.suppress(Exception):
        workspace.destroy()
