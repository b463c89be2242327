"""Overlapped steps replayed from CUDA graphs against the plain loop, on the GPU: the same
outputs. Only there does an overlapped step write the previous step's sampled ids into its
graph's input buffer on the device (`CudaGraphRunner`'s fill, after the packed input copy of
`engine/graph_inputs.py`); a wrong slot or buffer there shows as different tokens. The
workload is `tests/test_overlap.py`'s: continuous batching, chunked prefill, preemption,
prefix-cache hits, stops and penalties, in fp32."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))

from engine_helpers import run_staggered
from test_overlap import CASES, close, summary, workload

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", list(CASES))
def test_overlapped_graph_steps_give_the_plain_loops_outputs(qwen3_dir: Path, case: str) -> None:
    from openinfer_core import Engine, EngineConfig

    reqs = workload(seed=len(case))
    outputs, replays = [], []
    for overlap in (False, True):
        engine = Engine(EngineConfig(model=str(qwen3_dir), device="cuda", dtype="float32",
                                     block_size=4, async_scheduling=overlap,
                                     **CASES[case]))  # type: ignore[arg-type]
        assert engine.overlapped is overlap and engine.graphs is not None
        outputs.append(run_staggered(engine, reqs, lambda i: (i * 3) // 2))
        assert engine.kv.num_used_blocks == 0 and not engine.has_work()
        replays.append(engine.graphs.replays["decode"] + engine.graphs.replays["mixed"])
    want, got = outputs
    assert min(replays) > 0, "no step replayed from a graph"
    for r in reqs:
        assert close(summary(got[r.request_id]), summary(want[r.request_id])), r.request_id


@pytest.mark.parametrize("case", ["batching", "preemption"])
def test_a_loaded_engine_captures_the_buckets_its_steps_need(qwen3_dir: Path, case: str) -> None:
    """An engine that captured only its start buckets and is never idle (a server loaded from
    its first second) captures a step's own bucket before the step, a step in flight: the
    same outputs as the engine that captured every graph at start, fewer buckets pending."""
    from openinfer_core import Engine, EngineConfig

    reqs = workload(seed=len(case))
    outputs = []
    for defer in (False, True):
        engine = Engine(EngineConfig(model=str(qwen3_dir), device="cuda", dtype="float32",
                                     block_size=4, async_scheduling=True,
                                     **CASES[case]),  # type: ignore[arg-type]
                        defer_graphs=defer)
        assert engine.graphs is not None
        pending = len(engine.graphs.pending)
        outputs.append(run_staggered(engine, reqs, lambda i: (i * 3) // 2))
        assert engine.kv.num_used_blocks == 0 and not engine.has_work()
        if defer:
            assert pending > len(engine.graphs.pending), "no bucket captured under load"
    want, got = outputs
    for r in reqs:
        assert close(summary(got[r.request_id]), summary(want[r.request_id])), r.request_id
