"""The tensor-parallel gate's cases (`test_tp_gpu.py`), run by one engine in the process
that calls `engine_cases`: teacher-forced batch 1 eager, batch 1 from CUDA graphs, and a mixed
batch of 24-token chunks beside decodes from mixed-step graphs."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from forced import Picks, each_alone, run_forced

from openinfer_core.distributed.group import FP32_REDUCE_ENV
from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine

DECODES = 8  # decode steps after each prompt
CASES = ["batch1-eager", "batch1-graph", "mixed-24-graphs"]


def engine_cases(checkpoint: Path, tp: int, fp32_reduce: str | None,
                 sequences: list[list[int]],
                 cases: list[str]) -> dict[str, tuple[list[Picks], list[int]]]:
    """`cases` run by one engine at TP size `tp` (`fp32_reduce`: OPENINFER_TP_FP32_REDUCE's
    value, or None), closed after."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(message)s")
    if fp32_reduce is not None:
        os.environ[FP32_REDUCE_ENV] = fp32_reduce
    engine = _engine(checkpoint, tp)
    try:
        return _run_cases(engine, sequences, cases)
    finally:
        engine.close()


def _engine(checkpoint: Path, tp: int) -> Engine:
    return Engine(EngineConfig(model=str(checkpoint), device="cuda", max_model_len=1024,
                               max_num_seqs=8, max_num_batched_tokens=512,
                               num_kv_blocks=1024, tensor_parallel_size=tp))


def _run_cases(engine: Engine, sequences: list[list[int]],
               cases: list[str]) -> dict[str, tuple[list[Picks], list[int]]]:
    """Each case's picks and the sequences they cover."""
    out: dict[str, tuple[list[Picks], list[int]]] = {}
    every = list(range(len(sequences)))
    if "batch1-eager" in cases:
        out["batch1-eager"] = (each_alone(engine, sequences, DECODES), every)
    if "batch1-graph" in cases:
        assert engine.graphs is not None, "tensor parallelism must run from CUDA graphs"
        before = dict(engine.graphs.replays)
        picks = each_alone(engine, sequences, DECODES, use_graphs=True)
        assert engine.graphs.replays["decode"] >= before["decode"] + len(sequences) * (
            DECODES - 1)
        out["batch1-graph"] = (picks, every)
    if "mixed-24-graphs" in cases:
        assert engine.graphs is not None
        before = dict(engine.graphs.replays)

        def plan(step: int, i: int, done: int) -> int:
            if step < i % 5:  # staggered arrivals
                return 0
            n = len(sequences[i]) - DECODES
            return min(24, n - done) if done < n else 1

        picks = run_forced(engine, sequences, plan, use_graphs=True)
        assert engine.graphs.replays["mixed"] > before["mixed"] + 10
        out["mixed-24-graphs"] = (picks, every)
    return out
