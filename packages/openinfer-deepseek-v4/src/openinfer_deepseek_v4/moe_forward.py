"""The MoE sublayer as the serving path runs it: `reference.moe`'s composition, with the
router after its logits (`kernels/router`) and the shared expert's clamped SwiGLU
(`kernels/swiglu`; with FP8 weights the epilogue of its [gate; up] product,
`quantized.swiglu_linear`) one Triton launch each on the GPU in place of a dozen and four torch
ops, and the shared expert's output added by the FP4 experts' decode kernel (one rounding of the
sum where `reference.moe` rounds the routed sum first). On CPU every op is its reference, so
the numbers are `reference.moe`'s exactly. With expert parallelism (`experts`: the rank's) the
pairs of other ranks' experts drop out (`expert_parallel.local_routes`) and the caller sums
the ranks' outputs."""

from __future__ import annotations

import torch

from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.expert_parallel import local_routes
from openinfer_deepseek_v4.kernels.router import route_fused, route_hash, route_topk
from openinfer_deepseek_v4.quantized import linear, routed_experts, swiglu_linear
from openinfer_deepseek_v4.reference import MoEWeights
from openinfer_deepseek_v4.side_branches import takes_side
from openinfer_kernels.side_stream import beside


def moe_forward(x: torch.Tensor, token_ids: torch.Tensor, w: MoEWeights,
                cfg: DeepseekV4Config, experts: range | None = None,
                side: frozenset[str] = frozenset()) -> torch.Tensor:
    """`reference.moe`: routed experts plus the shared expert, x [T, H] -> [T, H]. With
    `experts` (expert parallelism: the global ids of the experts `w` holds) only the pairs
    routed to those, plus `w`'s slice of the shared expert: this rank's part of the sum.
    `side`: the branches that may run on the side stream (`side_branches`)."""
    beside_router = takes_side(side, "shared", x.shape[0])
    if beside_router:  # the shared expert beside the router and the routed experts' gate_up
        add, ready = beside(True, x.device, shared_expert, x, w, cfg)
    weights, ids = route(x, token_ids, w, cfg)
    if experts is not None:
        ids, weights = local_routes(ids, weights, experts)
    if not beside_router:
        # The shared expert's kernels run between the router and the routed experts: x, ids
        # and weights are settled (written two or more kernels back) when the experts' first
        # runs.
        add, ready = shared_expert(x, w, cfg), None
    return routed_experts(x, ids, weights, w.gate_up, w.down, cfg.swiglu_limit, add=add,
                          settled=not beside_router, add_ready=ready)


def route(x: torch.Tensor, token_ids: torch.Tensor, w: MoEWeights,
          cfg: DeepseekV4Config) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.route`: (weights [T, k] fp32, global expert ids [T, k] int64); the router's
    product and the routing in one launch where `route_fused` takes the rows."""
    fused = route_fused(x, w.gate, w.bias, w.tid2eid, token_ids, cfg.top_k,
                        cfg.routed_scaling_factor)
    if fused is not None:
        return fused
    logits = linear(x, w.gate)
    if w.tid2eid is not None:
        return route_hash(logits, w.tid2eid, token_ids, cfg.routed_scaling_factor)
    assert w.bias is not None
    return route_topk(logits, w.bias, cfg.top_k, cfg.routed_scaling_factor)


def shared_expert(x: torch.Tensor, w: MoEWeights, cfg: DeepseekV4Config) -> torch.Tensor:
    """`reference.shared_expert`: x [T, H] -> [T, H]."""
    return linear(swiglu_linear(x, w.shared_gate_up, cfg.swiglu_limit), w.shared_down)
