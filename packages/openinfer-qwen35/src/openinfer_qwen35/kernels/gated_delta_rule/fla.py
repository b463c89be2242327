"""The gated delta rule on CUDA through flash-linear-attention's Triton kernels (`fla-core`):
`chunk_gated_delta_rule` for steps with prompt chunks, `fused_recurrent_gated_delta_rule` for
decode steps. Imported only on a CUDA device: the CPU never loads fla."""

from __future__ import annotations

import torch


def gated_delta_rule_varlen_fla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                g: torch.Tensor, beta: torch.Tensor, states: torch.Tensor,
                                slots: torch.Tensor, fresh: torch.Tensor,
                                query_start_loc: torch.Tensor, decode: bool) -> torch.Tensor:
    """`reference.gated_delta_rule_varlen_ref`, same arguments and effects. A decode step
    makes no host synchronisation (CUDA graphs capture it); a prefill step reads the row
    bounds on the host (fla's chunk indices)."""
    from fla.ops.gated_delta_rule import (
        chunk_gated_delta_rule,
        fused_recurrent_gated_delta_rule,
    )

    index = slots.long()
    initial = states[index] * (~fresh).to(states.dtype)[:, None, None, None]
    if decode:  # [B, 1, ...]: one token per sequence, no cu_seqlens
        out, final = fused_recurrent_gated_delta_rule(
            q[:, None], k[:, None], v[:, None], g[:, None].float(), beta[:, None],
            initial_state=initial, output_final_state=True, use_qk_l2norm_in_kernel=True)
        out = out[:, 0]
    else:  # [1, T, ...] with the rows' bounds
        out, final = chunk_gated_delta_rule(
            q[None], k[None], v[None], g[None].float(), beta[None], initial_state=initial,
            output_final_state=True, use_qk_l2norm_in_kernel=True,
            cu_seqlens=query_start_loc.long())
        out = out[0]
    states.index_copy_(0, index, final.to(states.dtype))
    return out.to(v.dtype)
