"""The branches of a decode step that run on the side stream (`openinfer_kernels.side_stream`):
a V4-Flash decode step on a TP4 rank is some 20 dependent launches a layer, each held by its
own latency more than by the bytes it reads, so a branch that the kernels after it do not read
comes off that chain when it runs beside them:

- `shared`: the shared expert's two products (gate_up with its SwiGLU, then down), beside the
  router and the routed experts' gate_up; the routed down kernel, which adds the shared
  expert's output, waits for them (`moe_forward`);
- `pool`: the compressor's and the indexer's store and pooling of the step's projections,
  beside the query path (the q lora's norm, the queries' product, their norm and rotation);
  the indexer's top-k and the sparse attention, which read the pools, wait for them
  (`paged_attention`).

The kernels and their arithmetic are the same either way, so the logits are the same bits
(tests/gpu/test_golden_deepseek_v4_gpu.py, in CUDA graphs and eager). `OPENINFER_DSV4_SIDE_STREAM`
names them (a comma list; `1` for all, `0` for none; unset, both), read when a model is built;
only steps of at most `SIDE_TOKENS` tokens take the side stream (a prompt step's kernels fill
the GPU by themselves). V4-Flash's batch-1 TPOT at TP4 on four H200s (`gpu_check.sh dsv4full`,
DSV4FULL_VARIANTS): 5.15 ms with neither, 5.00 with `shared`, 4.96 with both."""

from __future__ import annotations

import os

SIDE_ENV = "OPENINFER_DSV4_SIDE_STREAM"
BRANCHES = ("shared", "pool")
DEFAULT = "1"
SIDE_TOKENS = 16


def side_branches() -> frozenset[str]:
    """The branches `OPENINFER_DSV4_SIDE_STREAM` names (unset: `DEFAULT`)."""
    raw = os.environ.get(SIDE_ENV, DEFAULT).strip()
    if raw in ("", "0"):
        return frozenset()
    if raw in ("1", "all"):
        return frozenset(BRANCHES)
    names = frozenset(name.strip() for name in raw.split(","))
    if unknown := names - set(BRANCHES):
        raise ValueError(f"{SIDE_ENV}={raw!r}: {sorted(unknown)} not among "
                         f"{', '.join(BRANCHES)} (a comma list; 1 for all, 0 for none)")
    return names


def takes_side(branches: frozenset[str], branch: str, tokens: int) -> bool:
    """Whether `branch` runs on the side stream in a step of `tokens` tokens."""
    return branch in branches and tokens <= SIDE_TOKENS
