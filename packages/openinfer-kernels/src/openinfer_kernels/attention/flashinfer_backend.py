"""The `flashinfer` attention backend: FlashInfer's paged kernels for the steps they win
(`pip install openinfer-kernels[flashinfer]`).

Steps of more than `GRAPH_TOKENS` tokens that are not pure decode (prompts and long chunks) run
FlashInfer's `BatchPrefillWithPagedKVCacheWrapper`, causal, whose `auto` backend is
FlashAttention-3 on Hopper. Decode steps and steps of up to `GRAPH_TOKENS` tokens run the
`triton` backend's kernels, which replay from CUDA graphs: FlashInfer plans each step on the host
before its kernels run, so it cannot be replayed from a graph as the engine captures them, and a
step launched eagerly costs more host time than its attention saves. `GRAPH_TOKENS` is the
Triton graphs' own limit, `SPLIT_MAX_TOKENS`, and where FlashInfer starts to win: the package
README gives the measurements and their command (benchmarks/LOG.md, "FlashInfer against
Triton", the history).
`OPENINFER_FLASHINFER_EVERY_STEP=1` runs every step on FlashInfer instead (decode steps on its
`BatchDecodeWithPagedKVCacheWrapper`, on tensor cores), with no CUDA graphs.

FlashInfer splits a step into a host-side `plan` (how the batch's pages are cut into work units)
and a `run` per layer. The backend plans once, at the step's first layer, from the
`ForwardBatch` it is given (every layer of a step gets the same one), reading the batch's host
copies of its lengths and block tables, and runs the plan at each layer. K/V are appended by
openinfer's own `kv_append` first. The caches are used as they are: FlashInfer's NHD layout,
`[num_blocks, block_size, Hkv, D]`, K and V apart. An e4m3 cache (`--kv-cache-dtype fp8`) is
planned with `kv_data_type` e4m3 and run with the layer's `k_scale` / `v_scale` (FlashInfer
folds k_scale into the softmax scale and multiplies the output by v_scale); its prompt steps
run FlashInfer's FA2 kernels, which read e4m3 pages beside bf16 queries (FA3's FP8 path wants
FP8 queries too). FlashInfer takes one k_scale and one v_scale per call: a layer whose scales
differ between KV heads (`KVScales.per_tensor` None: a per-head checkpoint) runs every step on
the Triton kernels, which read a scale per head; with OPENINFER_FLASHINFER_EVERY_STEP=1 it is
refused.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch

from openinfer_kernels.attention.kv_scales import scale_tensors
from openinfer_kernels.attention.triton import SPLIT_MAX_TOKENS
from openinfer_kernels.attention.triton_backend import TritonAttentionBackend
from openinfer_kernels.kv_store import FP8_KV_DTYPE, kv_append

if TYPE_CHECKING:
    from openinfer_core.interfaces.attention import KVScales
    from openinfer_core.interfaces.model import ForwardBatch

log = logging.getLogger("openinfer")

GRAPH_TOKENS = SPLIT_MAX_TOKENS  # steps up to this size replay from CUDA graphs on Triton's
WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended split-K scratch
HEAD_DIMS = (64, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)
# FlashInfer's kernel choice per wrapper; its `auto` picks FA3 on Hopper for prefill.
PREFILL_BACKEND = os.environ.get("OPENINFER_FLASHINFER_PREFILL", "auto")
DECODE_BACKEND = os.environ.get("OPENINFER_FLASHINFER_DECODE", "fa2")


class FlashInferAttentionBackend:
    """Appends K/V with `kv_append`, then runs FlashInfer's planned paged attention on the
    steps it wins and the `triton` backend on the others."""

    name = "flashinfer"

    def __init__(self, every_step: bool | None = None) -> None:
        try:
            import flashinfer
        except ImportError as exc:
            raise ImportError(
                "the flashinfer attention backend needs flashinfer-python: "
                "pip install 'openinfer-kernels[flashinfer]'") from exc
        if every_step is None:
            every_step = os.environ.get("OPENINFER_FLASHINFER_EVERY_STEP") == "1"
        self.every_step = every_step
        self.cuda_graph_safe = not every_step
        self.cuda_graph_max_tokens = 0 if every_step else GRAPH_TOKENS
        self._triton = TritonAttentionBackend()
        self._flashinfer = flashinfer
        self._workspace: torch.Tensor | None = None  # shared: one wrapper runs per step
        self._wrappers: dict[str, Any] = {}
        self._planned: ForwardBatch | None = None  # the batch the current plan is for
        self._wrapper: Any = None
        self._plan_copied: torch.cuda.Event | None = None
        self._told_per_head = False

    def runs_flashinfer(self, q: torch.Tensor, k_cache: torch.Tensor, batch: ForwardBatch,
                        kv_scales: KVScales | None = None) -> bool:
        """Whether this step runs FlashInfer's kernels, else the Triton ones: prompt steps
        FlashInfer has kernels for (fp16/bf16, its head sizes; e4m3 pages with one scale for
        all heads); every step with every_step, where the rest is refused."""
        if self.every_step:
            return True
        if not (batch.max_query_len > 1 and batch.num_tokens > GRAPH_TOKENS
                and q.dtype in DTYPES and k_cache.dtype in (q.dtype, FP8_KV_DTYPE)
                and k_cache.shape[-1] in HEAD_DIMS):
            return False
        if k_cache.dtype == FP8_KV_DTYPE and _per_head(kv_scales):
            if not self._told_per_head:
                log.info("flashinfer attention backend: the FP8 KV cache has per-head scales, "
                         "which FlashInfer's paged kernels do not take: every step runs the "
                         "Triton kernels")
                self._told_per_head = True
            return False
        return True

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
               scale: float, *, kv_scales: KVScales | None = None) -> torch.Tensor:
        k_scale, v_scale = scale_tensors(kv_scales)
        kv_append(k, v, k_cache, v_cache, batch.slot_mapping, k_scale=k_scale, v_scale=v_scale)
        return self.attend_appended(q, k_cache, v_cache, batch, scale, kv_scales=kv_scales)

    def attend_appended(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        batch: ForwardBatch, scale: float, *,
                        kv_scales: KVScales | None = None) -> torch.Tensor:
        if not self.runs_flashinfer(q, k_cache, batch, kv_scales):
            return self._triton.attend_appended(q, k_cache, v_cache, batch, scale,
                                                kv_scales=kv_scales)
        if k_cache.dtype == FP8_KV_DTYPE and _per_head(kv_scales):
            raise ValueError(
                "FlashInfer's paged attention takes one k_scale and one v_scale per layer, and "
                "this FP8 KV cache has a scale per KV head (the checkpoint's): unset "
                "OPENINFER_FLASHINFER_EVERY_STEP (such steps then run the Triton kernels), or "
                "use --attention-backend triton")
        if q.shape[0] == 0:
            return torch.empty_like(q)
        if self._planned is not batch:
            self._plan(q, k_cache, batch, scale)
        if k_cache.dtype != FP8_KV_DTYPE:
            return self._wrapper.run(q, (k_cache, v_cache))
        # One scale for all heads here (checked above): FlashInfer's numbers.
        per_tensor = None if kv_scales is None else kv_scales.per_tensor
        k_scale, v_scale = per_tensor or (1.0, 1.0)
        return self._wrapper.run(q, (k_cache, v_cache), k_scale=k_scale, v_scale=v_scale)

    def _plan(self, q: torch.Tensor, k_cache: torch.Tensor, batch: ForwardBatch,
              scale: float) -> None:
        _, page, hk, d = k_cache.shape
        hq = q.shape[1]
        if (d not in HEAD_DIMS or q.dtype not in DTYPES
                or k_cache.dtype not in (q.dtype, FP8_KV_DTYPE)):
            raise ValueError(
                f"FlashInfer runs head_dim {HEAD_DIMS} in float16 or bfloat16 (KV cache in "
                f"that dtype or e4m3), not head_dim {d} in {q.dtype} with a {k_cache.dtype} KV "
                "cache: unset OPENINFER_FLASHINFER_EVERY_STEP (such steps then run the Triton "
                "kernels), or use --dtype bfloat16")
        # Pinned, so that the plan's copies to the device wait for nothing queued before them
        # (the step in flight, with overlapped steps). The context lengths too: FlashInfer
        # copies them to the device, and when it derives them itself they are pageable, a copy
        # that waits for the GPU to finish everything queued before it.
        qo_indptr, kv_indptr, kv_indices, last_page_len, seq_lens = (
            t.pin_memory() for t in paged_layout(batch, page))
        # The plan rewrites a pinned host buffer whose last contents are copied to the device
        # ahead of the previous planned step: that copy must be done.
        if self._plan_copied is not None:
            self._plan_copied.synchronize()
        decode = batch.max_query_len == 1 and q.shape[0] == batch.num_seqs
        kind = "decode" if decode else "prefill"
        if k_cache.dtype == FP8_KV_DTYPE and not decode:
            kind = "prefill-fp8"
        wrapper = self._wrapper_for(kind, q.device)
        if decode:
            wrapper.plan(kv_indptr, kv_indices, last_page_len, hq, hk, d, page,
                         q_data_type=q.dtype, kv_data_type=k_cache.dtype, sm_scale=scale,
                         seq_lens=seq_lens)
        else:
            wrapper.plan(qo_indptr, kv_indptr, kv_indices, last_page_len, hq, hk, d, page,
                         causal=True, sm_scale=scale, q_data_type=q.dtype,
                         kv_data_type=k_cache.dtype, seq_lens=seq_lens)
        self._plan_copied = torch.cuda.Event()
        self._plan_copied.record()
        self._planned, self._wrapper = batch, wrapper

    def _wrapper_for(self, kind: str, device: torch.device) -> Any:
        if kind not in self._wrappers:
            if self._workspace is None:
                self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
            fi, workspace = self._flashinfer, self._workspace
            self._wrappers[kind] = (
                fi.BatchDecodeWithPagedKVCacheWrapper(
                    workspace, "NHD", use_tensor_cores=True, backend=DECODE_BACKEND)
                if kind == "decode" else
                fi.BatchPrefillWithPagedKVCacheWrapper(
                    workspace, "NHD",
                    backend="fa2" if kind == "prefill-fp8" else PREFILL_BACKEND))
        return self._wrappers[kind]


def _per_head(kv_scales: KVScales | None) -> bool:
    """Whether the KV heads have scales of their own (FlashInfer takes one for all)."""
    return kv_scales is not None and kv_scales.per_tensor is None


def paged_layout(batch: ForwardBatch, page: int) -> tuple[torch.Tensor, ...]:
    """FlashInfer's CSR description of the batch's pages, on the host: query offsets [B + 1],
    page offsets [B + 1], the pages in order [sum of pages], the tokens used in each request's
    last page [B] and the context lengths [B], all int32. Read from the batch's host copies
    where it has them, else copied from the device (one synchronisation)."""
    b = batch.num_seqs
    if (batch.query_start_loc_cpu is not None and batch.seq_lens_cpu is not None
            and batch.block_tables_cpu is not None):
        qo_indptr, seq_lens = batch.query_start_loc_cpu.int(), batch.seq_lens_cpu.int()
        tables = batch.block_tables_cpu.int()
    else:
        host = torch.cat([batch.query_start_loc.int(), batch.seq_lens.int(),
                          batch.block_tables.int().flatten()]).cpu()
        qo_indptr, seq_lens = host[:b + 1], host[b + 1:2 * b + 1]
        tables = host[2 * b + 1:].view(b, -1)
    pages = (seq_lens + page - 1) // page
    kv_indptr = torch.zeros(b + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(pages, 0)
    used = torch.arange(tables.shape[1]) < pages[:, None]
    last_page_len = seq_lens - (pages - 1) * page
    return qo_indptr, kv_indptr, tables[used], last_page_len.int(), seq_lens
