"""DeepSeek-V4's MoE (spec: shared deepseek-v4.md §6): router scores sqrt(softplus(x W_g^T)) in
fp32; experts picked by the top-k of score + a correction bias, or, in the first (hash) layers,
by a fixed token-id -> experts table; each picked expert weighted by its score over the picked
scores' sum, times a scaling factor. Experts are SwiGLU with the gate clamped from above and
the up projection clamped both ways. No capacity limit, no token dropping.

The routed experts' weights are FP4: e2m1 codes packed two per byte along I (the even index in
the low nibble), [O, I/2] int8, and an E8M0 scale per 32 values of a row, [O, I/32]."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from openinfer_kernels.fp8_linear.reference import e8m0_to_float
from openinfer_kernels.side_stream import wait_for

# e2m1 code -> value: sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequant_fp4_ref(packed: torch.Tensor, scale: torch.Tensor, group: int = 32,
                    dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """e2m1 codes packed two per byte ([O, I/2], int8 or uint8) times their group's scale
    ([O, I/group]) -> [O, I]."""
    byte = packed.view(torch.uint8)
    codes = torch.stack([byte & 0xF, byte >> 4], dim=-1).flatten(-2).long()
    values = torch.tensor(E2M1_VALUES, device=packed.device)[codes]
    return (values * e8m0_to_float(scale).repeat_interleave(group, 1)).to(dtype)


def _weights(scores: torch.Tensor, ids: torch.Tensor, scale: float) -> torch.Tensor:
    picked = scores.gather(1, ids)
    return picked / (picked.sum(dim=-1, keepdim=True) + 1e-20) * scale


def route_topk_ref(logits: torch.Tensor, bias: torch.Tensor, top_k: int,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] (x W_g^T) -> (weights [T, k] fp32, expert ids [T, k] int64). The bias
    ([E]) moves the selection only, not the weights."""
    scores = torch.sqrt(F.softplus(logits.float()))
    ids = torch.topk(scores + bias.float(), top_k, dim=-1).indices
    return _weights(scores, ids, scale), ids


def route_hash_ref(logits: torch.Tensor, tid2eid: torch.Tensor, token_ids: torch.Tensor,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Hash routing: the experts of token t are `tid2eid[token_ids[t]]` ([vocab, k] table); the
    weights come from the router's scores as in `route_topk_ref`."""
    scores = torch.sqrt(F.softplus(logits.float()))
    ids = tid2eid[token_ids].long()
    return _weights(scores, ids, scale), ids


def swiglu_clamped_ref(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    """[..., 2I] = [gate | up] -> silu(min(gate, limit)) * clamp(up, -limit, limit), [..., I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)


def moe_experts_ref(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                    gate_up: torch.Tensor, down: torch.Tensor, limit: float) -> torch.Tensor:
    """sum over token t's picked experts e of weights[t, e] * down_e(swiglu(gate_up_e x_t)):
    x [T, H], ids/weights [T, k], gate_up [E, 2I, H], down [E, H, I] -> [T, H] in x's dtype.
    One expert at a time over the tokens that picked it; id -1 (another rank's expert under
    expert parallelism) adds nothing."""
    out = torch.zeros_like(x)
    for expert in ids.unique().tolist():
        if expert < 0:
            continue
        token, slot = torch.where(ids == expert)
        h = swiglu_clamped_ref(F.linear(x[token], gate_up[expert]), limit)
        y = F.linear(h, down[expert]) * weights[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out


def fp4_moe_experts_ref(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                        gate_up: torch.Tensor, gate_up_scale: torch.Tensor, down: torch.Tensor,
                        down_scale: torch.Tensor, limit: float,
                        add: torch.Tensor | None = None, settled: bool = False,
                        add_ready: torch.cuda.Event | None = None) -> torch.Tensor:
    """`moe_experts_ref` over FP4 experts, dequantized to x's dtype first: gate_up
    [E, 2I, H/2] and down [E, H, I/2] packed e2m1 codes (uint8 or int8), their E8M0 scales
    [E, 2I, H/32] and [E, H, I/32] (uint8 or float8_e8m0fnu) -> [T, H] in x's dtype; plus
    `add` ([T, H] in x's dtype, the shared expert's output) where given, as `moe` adds it,
    once the stream has waited for `add_ready` (the event of the side stream that writes it;
    None on CPU). `settled` (the kernels' launch hint: when x, ids and weights were written)
    changes nothing here."""
    def dequant(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.stack([dequant_fp4_ref(p, s, dtype=x.dtype)
                            for p, s in zip(packed, scale, strict=True)])

    # Only the picked experts, renumbered: all 256 of V4-Flash's would take 12 GiB in bf16
    # (-1, another rank's, stays -1).
    wait_for(add_ready)
    held = ids >= 0
    if not held.any():
        return torch.zeros_like(x) if add is None else add.clone()
    used, renumbered = torch.unique(ids[held], return_inverse=True)
    local = torch.full_like(ids, -1, dtype=torch.long)
    local[held] = renumbered
    out = moe_experts_ref(x, local, weights, dequant(gate_up[used], gate_up_scale[used]),
                          dequant(down[used], down_scale[used]), limit)
    return out if add is None else out + add
