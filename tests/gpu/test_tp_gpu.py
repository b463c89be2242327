"""The tensor-parallel gate on GPUs (NCCL and symmetric memory): the golden gate's bounds
(DESIGN §7: regret of our pick <= 0.20 nat, |Δ logprob| over our top 8: mean <= 0.06,
p99 <= 0.20) against transformers in bf16, as the one-GPU gate, at TP2 (and TP4 on a machine
with 4 GPUs) with CUDA graphs on.

Checkpoints: random weights at Qwen3-4B's shapes (8 KV heads), and the same with one KV head
and 4 layers (fewer KV heads than ranks: each rank holds a copy of the KV head and its share
of the query heads). Cases, each teacher-forced over sequences with prompts of 1-500 tokens:
- batch 1 eager: the prompt in one step with logits at every position, then decodes;
- batch 1 from CUDA graphs: the prompt from a mixed-step graph, then decode graphs;
- a mixed batch of 24-token chunks beside decodes, every step from mixed-step graphs.

Batch 1 eager runs at TP1 beside them (the one-GPU baseline of this run; the one-GPU golden
gate covers the other cases), and two diagnostics are recorded with it: the distance of each
TP size from TP1 (`forced.pick_distance`: two bf16 runs of ours compared) and the
`fp32-reduce` experiment
(`OPENINFER_TP_FP32_REDUCE=1`: each rank's partial products kept in fp32 and summed in fp32,
so the sum is rounded once, as one GPU's GEMM rounds it)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from forced import (
    assert_within,
    gate_row,
    in_fresh_process,
    pick_distance,
    random_sequences,
    record,
    reference_logprobs,
)
from tp_cases import CASES, DECODES, engine_cases

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")]

PROMPT_LENS = [1, 17, 64, 128, 255, 300, 400, 500]
# The fp32-reduce experiment's runs (OPENINFER_TP_GATE_FP32=0 leaves them out, for a call
# short of time: the gate itself does not depend on them).
FP32_EXPERIMENT = os.environ.get("OPENINFER_TP_GATE_FP32", "1") != "0"
# TP4 where the machine has 4 GPUs (the issue asks for both; 2-GPU machines run TP2 alone)
TP_SIZES = [2, 4] if torch.cuda.is_available() and torch.cuda.device_count() >= 4 else [2]


@pytest.fixture(scope="module", params=["qwen3-4b", "one-kv-head"])
def checkpoint(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    from openinfer_qwen3.random_weights import write_random_weights
    from openinfer_qwen3.shapes import write_config_folder

    folder = write_config_folder("Qwen3-4B", tmp_path_factory.mktemp(request.param))
    if request.param == "one-kv-head":
        config = json.loads((folder / "config.json").read_text())
        config.update(num_key_value_heads=1, num_hidden_layers=4)
        (folder / "config.json").write_text(json.dumps(config))
    write_random_weights(folder, folder)
    return folder


@pytest.fixture(scope="module")
def sequences() -> list[list[int]]:
    return random_sequences(32, PROMPT_LENS, DECODES, vocab=151643)


@pytest.fixture(scope="module")
def reference(checkpoint: Path, sequences: list[list[int]]) -> list[torch.Tensor]:
    """transformers' logprobs (bf16 forward, fp32 log-softmax) at every position, on the host."""
    from transformers import AutoModelForCausalLM

    return reference_logprobs(
        AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).cuda().eval(),
        sequences)


@pytest.fixture(scope="module")
def runs(checkpoint: Path, sequences: list[list[int]]) -> dict[str, dict]:  # type: ignore[type-arg]
    """Every case at each TP size; batch 1 eager at TP1 and with the fp32-reduce experiment
    too (the one-GPU gate covers TP1's other cases). Each engine runs in a process of its own,
    as a served engine does: one tensor-parallel group per process (`all_reduce.py`)."""
    plan = [("tp1", 1, None, ["batch1-eager"])]
    for tp in TP_SIZES:
        plan += [(f"tp{tp}", tp, None, CASES)]
        if FP32_EXPERIMENT:
            plan += [(f"tp{tp}-fp32-reduce", tp, "1", ["batch1-eager"])]
    got = {}
    for name, tp, env, cases in plan:
        started = time.perf_counter()
        got[name] = in_fresh_process(engine_cases, checkpoint, tp, env, sequences, cases)
        print(f"{checkpoint.name} {name}: {time.perf_counter() - started:.0f} s", flush=True)
    return got


@pytest.mark.parametrize("tp", TP_SIZES)
@pytest.mark.parametrize("case", CASES)
def test_tp_passes_the_golden_gate(checkpoint: Path, runs, reference,  # type: ignore[no-untyped-def]
                                   case: str, tp: int) -> None:
    label = checkpoint.name.rstrip("0123456789")
    name = f"tp{tp}"
    rows = {}
    for run in ("tp1", name):
        if case in runs[run]:
            picks, which = runs[run][case]
            rows[run] = gate_row(f"{run}-{case}-{label}", picks, reference, which)
            if run != "tp1" or tp == TP_SIZES[0]:  # TP1's row once
                record(rows[run])
    if case == "batch1-eager":
        distance: dict[str, object] = dict(pick_distance(runs["tp1"][case][0],
                                                         runs[name][case][0]))
        if FP32_EXPERIMENT:
            picks, which = runs[f"{name}-fp32-reduce"][case]
            record(gate_row(f"{name}-fp32-reduce-{case}-{label}", picks, reference, which))
            distance["fp32_reduce"] = pick_distance(runs["tp1"][case][0],
                                                    runs[f"{name}-fp32-reduce"][case][0])
        record({"case": f"{name}-vs-tp1-{case}-{label}", **distance})
    assert_within(rows[name])
