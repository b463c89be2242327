"""CUDA graphs change nothing but speed: the same teacher-forced steps (prefill chunks over a
cached prefix beside decodes) replayed from the mixed-step and decode graphs give the eager
forward's logits, in fp32 on the GPU where both agree to summation order. A wrong token,
request or padding mapping in a graph shows as an O(1) difference, not 1e-5."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from forced import run_forced

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("spec", ["gqa-tied", "odd-sizes"])
@pytest.mark.parametrize("chunk", [5, 24, 40])
def test_graphs_give_the_eager_logits(qwen3_dirs: dict[str, Path], spec: str,
                                      chunk: int) -> None:
    from openinfer_core.engine.config import EngineConfig
    from openinfer_core.engine.engine import Engine

    engine = Engine(EngineConfig(model=str(qwen3_dirs[spec]), device="cuda", dtype="float32",
                                 max_model_len=512, max_num_seqs=12, num_kv_blocks=512,
                                 max_num_batched_tokens=512))
    assert engine.graphs is not None and engine.graphs.mixed[-1] == 512
    rng = random.Random(chunk)
    lengths = [1, 2, 9, 16, 17, 40, 63, 100, 128, 200, 301, 450]
    sequences = [[rng.randrange(151643) for _ in range(n + 6)] for n in lengths]

    def plan(step: int, i: int, done: int) -> int:
        if step < i % 4:  # staggered arrivals
            return 0
        n = lengths[i]
        return min(chunk, n - done) if done < n else 1

    before = dict(engine.graphs.replays)
    graphs = run_forced(engine, sequences, plan, use_graphs=True)
    assert engine.graphs.replays["mixed"] > before["mixed"] + 5
    assert engine.graphs.replays["decode"] > before["decode"]
    # Every graph's logits are a view of one shared buffer, not an output of its own.
    outputs = [*engine.graphs._logits.values(), *engine.graphs._mixed_logits.values()]
    assert engine.graphs._out is not None and len(outputs) > 10
    assert {t.data_ptr() for t in outputs} == {engine.graphs._out.data_ptr()}
    eager = run_forced(engine, sequences, plan, use_graphs=False)
    for g, e in zip(graphs, eager, strict=True):
        assert g.positions == e.positions
        assert torch.equal(g.top_ids[:, 0], e.top_ids[:, 0])
        torch.testing.assert_close(g.top_logprobs, e.top_logprobs, rtol=1e-4, atol=1e-4)
