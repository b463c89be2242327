"""The gated delta rule on CUDA through flash-linear-attention's Triton kernels (`fla-core`):
`chunk_gated_delta_rule` for steps with prompt chunks, `fused_recurrent_gated_delta_rule` for
decode steps. Imported only on a CUDA device: the CPU never loads fla.

fla's calling conventions (fla 0.6, `ops/gated_delta_rule/chunk.py`, `fused_recurrent.py`):
time-first `[B, T, H, K]` tensors (a flattened batch: B = 1 with `cu_seqlens`), `g` the log of
the decay in fp32, `beta` after its sigmoid, the state `[N, HV, K, V]` (keys x values, fp32),
`scale` K^-0.5 by default. fla keeps no state slots of its own: each step gathers its rows'
states and scatters the final ones back."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

# fla routes every call through a backend registry (`fla/backends.py`): a per-call walk over
# its candidates, each a dynamo-disabled wrapper. The Triton kernels are the only backend
# used here; with dispatch off the calls go straight to them. Read once, when fla imports.
os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")

CHUNK = 64  # fla's chunk size for the gated delta rule


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """One prefill step's varlen bounds for fla, built once and shared by every linear layer:
    `cu_seqlens` [B + 1] int64 on the device, its host copy, and `chunk_indices` [NT, 2]
    (row, chunk of that row) int64 on the device. Built from the host bounds, no kernel of
    fla's reads them back (`prepare_chunk_indices` would: a sync every layer), and one
    `cu_seqlens` object lets fla's identity cache (`tensor_cache`) keep its chunk offsets for
    the whole step."""

    cu_seqlens: torch.Tensor
    cu_seqlens_cpu: torch.Tensor
    chunk_indices: torch.Tensor

    @classmethod
    def of(cls, query_start_loc: torch.Tensor,
           query_start_loc_cpu: torch.Tensor | None) -> ChunkPlan:
        host = (query_start_loc_cpu if query_start_loc_cpu is not None
                else query_start_loc.cpu()).numpy().astype(np.int64)
        lens = np.diff(host)
        counts = (lens + CHUNK - 1) // CHUNK
        rows = np.repeat(np.arange(len(lens), dtype=np.int64), counts)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        chunks = np.stack([rows, np.arange(len(rows), dtype=np.int64) - first], axis=1)
        device = query_start_loc.device
        return cls(_to_device(host, device), torch.from_numpy(host),
                   _to_device(np.ascontiguousarray(chunks), device))


def _to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    host = torch.from_numpy(a)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def gated_delta_rule_varlen_fla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                g: torch.Tensor, beta: torch.Tensor, states: torch.Tensor,
                                slots: torch.Tensor, fresh: torch.Tensor,
                                query_start_loc: torch.Tensor, decode: bool, *,
                                plan: ChunkPlan | None = None) -> torch.Tensor:
    """`reference.gated_delta_rule_varlen_ref`, same arguments and effects. A decode step
    makes no host synchronisation (CUDA graphs capture it); a prefill step takes its bounds
    from `plan` (built here from `query_start_loc`, a sync, where the caller has none).
    Tokens past `query_start_loc[-1]` come out as zeros, as in the reference."""
    from fla.ops.gated_delta_rule import (
        chunk_gated_delta_rule,
        fused_recurrent_gated_delta_rule,
    )

    index = slots.long()
    initial = states[index] * (~fresh).to(states.dtype)[:, None, None, None]
    # fla's input guard copies non-contiguous inputs too; done here so that every layout
    # (a T = 1 view of the convolution's output counts as contiguous) reaches the kernels
    # the same way.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g, beta = g.float().contiguous(), beta.contiguous()
    if decode:  # [B, 1, ...]: one token per sequence, no cu_seqlens
        # By keyword: this function's fourth to sixth parameters are g, gk, gv (beta is the
        # seventh), unlike chunk_gated_delta_rule's (q, k, v, g, beta).
        out, final = fused_recurrent_gated_delta_rule(
            q[:, None], k[:, None], v[:, None], g=g[:, None], beta=beta[:, None],
            initial_state=initial, output_final_state=True, use_qk_l2norm_in_kernel=True)
        out = out[:, 0]
    else:  # [1, T, ...] with the rows' bounds
        plan = plan or ChunkPlan.of(query_start_loc, None)
        out, final = chunk_gated_delta_rule(
            q[None], k[None], v[None], g=g[None], beta=beta[None], initial_state=initial,
            output_final_state=True, use_qk_l2norm_in_kernel=True,
            cu_seqlens=plan.cu_seqlens, cu_seqlens_cpu=plan.cu_seqlens_cpu,
            chunk_indices=plan.chunk_indices)
        out = out[0]
        ends = plan.cu_seqlens_cpu
        if int(ends[-1]) < out.shape[0]:  # padding tokens: fla leaves them unwritten
            out[int(ends[-1]):] = 0
    states.index_copy_(0, index, final.to(states.dtype))
    return out.to(v.dtype)
