"""A cold start compiles every start-up kernel in its first, single compile-ahead round
(`startup/compile_round.py`): the memory profile, the CUDA-graph captures, the eager warm-up
and the sampler's warm-up that follow compile nothing more, with the variants compiled in
threads or in the worker processes (which must name the same variants: a different one would
be compiled again here).
Run in a fresh process with an empty Triton cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = """
import json, sys
from pathlib import Path
from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.plugins import get_plugin_manager
from openinfer_core.startup import bring_up
from openinfer_core.startup.kernel_compilers import start_compile_workers

cache = Path(sys.argv[2])
if sys.argv[3] == "workers":
    assert start_compile_workers("cuda", get_plugin_manager())
counts = {}
first_round = bring_up.compile_start_kernels

def counted(config, model, plan):
    seconds = first_round(config, model, plan)
    counts["after_first_round"] = sorted(p.stem for p in cache.rglob("*.cubin"))
    return seconds

bring_up.compile_start_kernels = counted
Engine(EngineConfig(model=sys.argv[1], device="cuda", max_model_len=512, max_num_seqs=40,
                    max_num_batched_tokens=512))
counts["after_start"] = sorted(p.stem for p in cache.rglob("*.cubin"))
print(json.dumps(counts))
"""


@pytest.mark.parametrize("where", ["threads", "workers"])
def test_later_phases_compile_nothing(qwen3_dirs: dict[str, Path], tmp_path: Path,
                                      where: str) -> None:
    cache = tmp_path / "triton"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "OPENINFER_COMPILE_AHEAD": "1",
           "OPENINFER_STARTUP_CACHE_DIR": str(tmp_path / "startup")}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(qwen3_dirs["gqa-tied"]), str(cache),
                           where],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["after_first_round"], "the first round compiled nothing"
    # The sampler's kernels are in the round too (its warm-up), so no sampled step compiles.
    assert {"_race_kernel", "_row_max_kernel", "_top_p_race_kernel"} <= set(
        counts["after_first_round"])
    assert counts["after_start"] == counts["after_first_round"], (
        "compiled after the first round: "
        f"{sorted(set(counts['after_start']) - set(counts['after_first_round']))}")
