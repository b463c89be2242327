"""Expert parallelism (`--enable-expert-parallel`): the routed experts split whole over the
tensor-parallel ranks, rank r holding experts [starts[r], starts[r + 1]).

The attention is tensor-parallel, so every rank has every token's hidden state, and the MoE
runs as the width-split one does, ending in the same all-reduce (fused with hc_post): each
rank routes every token (the router is replicated), keeps the (token, slot) pairs whose
expert it holds, renumbered from its first expert (`local_routes`; another rank's pairs get
id -1 and weight 0, which the expert kernels skip without reading a weight), and adds its
width slice of the shared expert, split as without expert parallelism. The sum over the
ranks is the MoE. Nothing a step computes reaches the host, so expert-parallel steps replay
from CUDA graphs like the others.

Against width-split experts the bytes a rank reads differ only in balance: at batch 1 a rank
reads whole experts for the pairs it holds (top_k * E_rank / E on average), and the busiest
rank sets the step's pace; at large batches every expert is read either way."""

from __future__ import annotations

import torch


def local_routes(ids: torch.Tensor, weights: torch.Tensor,
                 experts: range) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] global expert ids and their weights [T, k] -> (ids numbered within
    `experts`, this rank's, with -1 for the pairs of other ranks; weights with 0 there).
    Elementwise ops on the device (six launches, no fills): no host sync."""
    local = ids - experts.start
    held = (local >= 0) & (local < len(experts))
    return torch.where(held, local, -1), torch.where(held, weights, 0.0)
