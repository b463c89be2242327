"""The delta rule's chunk plan (`kernels/gated_delta_rule/fla.py`, `ChunkPlan`), built on the
host once per step, against what fla builds itself from `cu_seqlens` (`prepare_chunk_indices`,
`prepare_chunk_offsets`), which the plan replaces on the GPU."""

from __future__ import annotations

import pytest
import torch

from openinfer_qwen35.kernels.gated_delta_rule import chunk_plan
from openinfer_qwen35.kernels.gated_delta_rule.fla import CHUNK, ChunkPlan


@pytest.mark.parametrize("lengths", [[1], [63], [64], [65], [1, 70, 5], [128, 1, 1, 33],
                                     [2048, 0, 7]])
def test_plan_matches_fla(lengths: list[int]) -> None:
    from fla.ops.utils.index import prepare_chunk_indices

    qsl = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    plan = ChunkPlan.of(qsl, qsl)
    assert plan.cu_seqlens.dtype == torch.int64 and plan.chunk_indices.dtype == torch.int64
    assert plan.cu_seqlens.tolist() == qsl.tolist() == plan.cu_seqlens_cpu.tolist()
    want = prepare_chunk_indices(qsl.long(), CHUNK)
    assert plan.chunk_indices.tolist() == want.tolist()
    assert len(plan.chunk_indices) == sum(-(-n // CHUNK) for n in lengths)


def test_no_plan_on_decode_or_cpu() -> None:
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
    assert chunk_plan(qsl, qsl, decode=True) is None
    assert chunk_plan(torch.tensor([0, 5], dtype=torch.int32), None, decode=False) is None
