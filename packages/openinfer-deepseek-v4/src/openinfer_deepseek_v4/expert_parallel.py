"""Expert parallelism (`--enable-expert-parallel`): the routed experts split whole over the
tensor-parallel ranks, rank r holding experts [starts[r], starts[r + 1]).

The attention is tensor-parallel, so every rank has every token's hidden state. The step's
tokens are split over the ranks too (`split_range`, as even as can be): each rank

1. routes its own tokens and runs the shared expert (replicated) on them;
2. sends each (token, picked expert) row to the expert's rank (`TensorParallelGroup.all_to_all`,
   with the expert's number on that rank), runs the rows it receives through its own experts
   and sends the outputs back along the same routes;
3. sums its tokens' outputs with their routing weights (fp32), adds the shared expert's;

and the ranks all-gather their tokens' rows. So a rank computes the router and the shared
expert for 1/N of the tokens and its experts only for the rows that picked them; the price is
an exchange of counts, three all-to-alls and an all-gather per layer where width-split experts
need one all-reduce.
With FP4 experts on the GPU the rank's experts are one `Fp4Experts` of its experts only, the ids
it receives already renumbered."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from openinfer_core.distributed.sharding import split_range
from openinfer_core.interfaces.model import TensorParallelGroup
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.moe_forward import route, shared_expert
from openinfer_deepseek_v4.quantized import routed_experts
from openinfer_deepseek_v4.reference import MoEWeights


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Where a rank's (token, slot) pairs go: `order` lists the flat pairs (token * k + slot)
    in the order they are sent (by destination rank, stable), `send_counts[r]` of them to rank
    r, each with its expert's number on that rank (`local_ids`, in `order`)."""

    order: torch.Tensor  # [n * k] int64
    send_counts: list[int]
    local_ids: torch.Tensor  # [n * k] int64


def plan_dispatch(ids: torch.Tensor, starts: torch.Tensor) -> Dispatch:
    """ids [n, k] global expert ids; starts [size + 1] the first expert of each rank, then
    the number of experts. Reads the counts back to the host (the all-to-all's sizes)."""
    flat = ids.reshape(-1)
    owner = torch.bucketize(flat, starts[1:-1], right=True)
    order = torch.argsort(owner, stable=True)
    counts = torch.bincount(owner, minlength=starts.shape[0] - 1).tolist()
    return Dispatch(order, counts, (flat - starts[owner])[order])


def exchange(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, starts: torch.Tensor,
             group: TensorParallelGroup, w: MoEWeights, limit: float) -> torch.Tensor:
    """The routed experts' output for this rank's tokens: x [n, H] with their experts (ids,
    weights [n, k]) -> [n, H] in x's dtype. Every rank calls it in the same step, whether it
    has tokens or not: it also runs the rows the other ranks send."""
    n, k = ids.shape
    plan = plan_dispatch(ids, starts)
    rows, got = group.all_to_all(x[plan.order // k], plan.send_counts)
    local, _ = group.all_to_all(plan.local_ids, plan.send_counts, got)
    out = local_experts(rows, local, w, limit)
    back, _ = group.all_to_all(out, got, plan.send_counts)
    pairs = torch.empty_like(back)
    pairs[plan.order] = back
    return (pairs.view(n, k, x.shape[1]).float() * weights[..., None].float()).sum(1).to(x.dtype)


def local_experts(rows: torch.Tensor, local_ids: torch.Tensor, w: MoEWeights,
                  limit: float) -> torch.Tensor:
    """Each received row [R, H] through its expert (`local_ids` [R], numbered on this rank),
    unweighted: [R, H]."""
    if rows.shape[0] == 0:
        return rows.new_zeros(rows.shape)
    ones = torch.ones((rows.shape[0], 1), dtype=torch.float32, device=rows.device)
    return routed_experts(rows, local_ids[:, None], ones, w.gate_up, w.down, limit)


def gather_tokens(own: torch.Tensor, num_tokens: int, group: TensorParallelGroup) -> torch.Tensor:
    """Every rank's rows (rank r's: its `split_range(num_tokens, size, r)` tokens, [n_r, H])
    in token order: [num_tokens, H] on every rank."""
    size, hidden = group.size, own.shape[1]
    part = -(-num_tokens // size)
    padded = F.pad(own, (0, 0, 0, part - own.shape[0])).reshape(1, -1)
    every = group.all_gather(padded).view(size, part, hidden)
    return torch.cat([every[r, :len(split_range(num_tokens, size, r))] for r in range(size)])


def expert_parallel_moe(x: torch.Tensor, token_ids: torch.Tensor, w: MoEWeights,
                        cfg: DeepseekV4Config, starts: torch.Tensor,
                        group: TensorParallelGroup) -> torch.Tensor:
    """`reference.moe` over the ranks: x [T, H] and token_ids [T], the same on every rank
    -> [T, H] on every rank. `w` holds the rank's experts (`starts`: see `plan_dispatch`)."""
    own = split_range(x.shape[0], group.size, group.rank)
    xs = x[own.start:own.stop]
    weights, ids = route(xs, token_ids[own.start:own.stop], w, cfg)
    out = exchange(xs, ids, weights, starts, group, w, cfg.swiglu_limit)
    return gather_tokens(out + shared_expert(xs, w, cfg), x.shape[0], group)
