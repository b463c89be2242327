"""Our all-reduce + residual add + RMSNorm over symmetric memory
(`OPENINFER_TP_FUSED_NORM=triton`, and `push`: the push kernel for up to 64 rows, its rows
signalling by themselves or, `push-flags`, by flags; `linear`: push, and Qwen3-8B's o_proj shard
pushing its own rows for 1 to 4 rows; `openinfer_kernels.collective`) on
2 GPUs, and on 4 where
the machine has them: each rank's random partial products, 1 to 300 rows of 4096 bf16 values,
twice in a row; the new residual stream bit for bit the reference's of every rank's partials
(fp32 sums in rank order, rounded once), the norm within a bf16 ulp of it, every rank alike,
and within bf16 rounding of the unfused path (the group's all-reduce, then
`fused_add_rms_norm`). Then ours, torch's one-shot and ours again in one CUDA graph, replayed:
every replay equals the eager run, and every signal pad is back to 0 at the end
(`tp_add_norm_ranks.py` holds a rank's checks)."""

from __future__ import annotations

import json
import multiprocessing
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from tp_add_norm_ranks import run_rank

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")]

SIZES = [2, 4] if torch.cuda.is_available() and torch.cuda.device_count() >= 4 else [2]
TIMEOUT_S = 120  # a barrier that never meets hangs its ranks: they are killed past this (a
# pass takes ~16 s on 2 H200s)


@pytest.mark.parametrize("mode", ["triton", "push", "push-flags", "linear"])
@pytest.mark.parametrize("size", SIZES)
def test_ours_matches_the_reference_and_the_unfused_path(size: int, mode: str,
                                                         tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    out = str(tmp_path / "rank")
    ranks = [context.Process(target=run_rank,
                             args=(rank, size, str(tmp_path / "store"), out, mode))
             for rank in range(size)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(TIMEOUT_S)
    hung = [rank for rank, process in enumerate(ranks) if process.is_alive()]
    for process in ranks:
        if process.is_alive():
            process.kill()
    assert not hung, f"ranks {hung} still ran after {TIMEOUT_S} s (a barrier never met?)"
    results = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(size)]
    errors = {rank: r["error"] for rank, r in enumerate(results) if r["error"]}
    assert not errors, "\n".join(f"rank {rank}:\n{e}" for rank, e in errors.items())
    print(json.dumps({"tp": size, "mode": mode,
                      **{k: v for k, v in results[0].items() if k != "error"}}))
