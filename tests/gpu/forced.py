"""Teacher forcing through the engine's own model, KV cache and CUDA graphs: sequences advance
by a planned number of tokens per step (prefill chunks and decodes mixed in one forward), and
the next-token logits at every chunk's end are kept for comparison with transformers."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from openinfer_core.engine.batch import plan_batch
from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.engine.request_state import RequestState
from openinfer_core.interfaces.scheduler import ScheduledRow
from openinfer_core.request import GenerateRequest

TOP = 8
T = TypeVar("T")
# The golden gate's bounds (DESIGN §7), per compared position: regret of our pick (nat), and
# |Δ logprob| over our top 8 (mean, p99).
GOLDEN_BOUNDS = {"regret_max": 0.20, "dlogprob_mean": 0.06, "dlogprob_p99": 0.20}
RESULTS = Path(os.environ.get("OPENINFER_GPU_RESULTS", "/tmp/openinfer-gpu-results"))


@dataclass
class Picks:
    """Per compared position of one sequence: our top-8 ids and logprobs (best first)."""

    positions: list[int]  # the position whose next token the logits predict
    top_ids: torch.Tensor  # [P, 8] int64, CPU
    top_logprobs: torch.Tensor  # [P, 8] fp32, CPU


# plan(step, seq index, tokens computed so far) -> tokens to run this step (0 = idle)
Plan = Callable[[int, int, int], int]


@torch.inference_mode()
def run_forced(engine: Engine, sequences: Sequence[Sequence[int]], plan: Plan, *,
               use_graphs: bool, all_positions: bool = False) -> list[Picks]:
    seqs = [RequestState.from_request(GenerateRequest(f"forced-{i}", tuple(t)))
            for i, t in enumerate(sequences)]
    found: list[list[tuple[int, torch.Tensor]]] = [[] for _ in seqs]
    step = 0
    try:
        while any(s.num_computed_tokens < s.num_tokens - 1 for s in seqs):
            rows, owners = [], []
            for i, s in enumerate(seqs):
                left = s.num_tokens - 1 - s.num_computed_tokens  # the last token has no target
                k = min(plan(step, i, s.num_computed_tokens), left)
                if k > 0:
                    assert engine.kv.allocate(s.request_id, s.num_computed_tokens + k)
                    rows.append(ScheduledRow(s, k, True))
                    owners.append(i)
            step += 1
            if not rows:
                continue
            host = plan_batch(rows, engine.kv)
            if all_positions:
                host.logits_indices = np.arange(len(host.input_ids), dtype=np.int64)
            if use_graphs and engine.graphs is not None and engine.graphs.can_run(host):
                logits = engine.graphs.run(host)
            else:
                assert not (use_graphs and host.is_decode), "expected a CUDA graph to run"
                logits = engine.model.forward(host.to_device(engine.model.device))
            _collect(logits, rows, owners, host.query_start_loc.tolist(), all_positions, found)
            for row in rows:
                row.seq.num_computed_tokens += row.num_new_tokens
    finally:
        for s in seqs:
            engine.kv.free(s.request_id)
    return [_picks(f) for f in found]


def _collect(logits: torch.Tensor, rows: list[ScheduledRow], owners: list[int],
             starts: list[int], all_positions: bool,
             found: list[list[tuple[int, torch.Tensor]]]) -> None:
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    vals, ids = logprobs.topk(TOP, dim=-1)
    packed = torch.cat([ids.double(), vals.double()], dim=-1).cpu()
    r = 0
    for b, row in enumerate(rows):
        first = row.seq.num_computed_tokens
        count = row.num_new_tokens if all_positions else 1
        for j in range(count):
            pos = first + row.num_new_tokens - count + j
            found[owners[b]].append((pos, packed[r]))
            r += 1
    assert r == logits.shape[0], (r, logits.shape, starts[-1])


def _picks(found: list[tuple[int, torch.Tensor]]) -> Picks:
    found.sort(key=lambda item: item[0])
    rows = torch.stack([p for _, p in found])
    return Picks([pos for pos, _ in found], rows[:, :TOP].long(), rows[:, TOP:].float())


def gate_row(name: str, picks: list[Picks], reference: list[torch.Tensor],
             which: list[int]) -> dict[str, object]:
    """The golden gate's numbers (DESIGN §7) for `picks` against transformers' logprobs
    `reference[which[n]]` of each sequence: regret of our pick, |Δ logprob| over our top 8
    (mean, p99), and the worst pick (our top-3 logprobs beside transformers' for the same ids:
    a near-tie in ours that transformers orders the other way is bf16 noise, not a wrong
    forward)."""
    regrets, deltas = [], []
    for p, i in zip(picks, which, strict=True):
        ref = reference[i][p.positions]  # [P, V]
        best = ref.max(dim=-1).values
        regrets.append(best - ref.gather(1, p.top_ids[:, :1]).squeeze(1))
        deltas.append((p.top_logprobs - ref.gather(1, p.top_ids)).abs().flatten())
    regret, delta = torch.cat(regrets), torch.cat(deltas)
    seq_of = torch.cat([torch.full((len(p.positions),), n) for n, p in enumerate(picks)])
    worst = int(regret.argmax())
    n = int(seq_of[worst])
    k = worst - sum(len(q.positions) for q in picks[:n])
    ref_row = reference[which[n]][picks[n].positions[k]]
    worst_pick = {"position": picks[n].positions[k],
                  "ours": picks[n].top_logprobs[k, :3].tolist(),
                  "theirs": ref_row[picks[n].top_ids[k, :3]].tolist()}
    return {"case": name, "positions": int(regret.numel()), "regret_max": regret.max().item(),
            "dlogprob_mean": delta.mean().item(), "dlogprob_p99": delta.quantile(0.99).item(),
            "regret_over_0.1": int((regret > 0.1).sum().item()), "worst_pick": worst_pick}


def each_alone(engine: Engine, sequences: Sequence[Sequence[int]], decodes: int, *,
               use_graphs: bool = False) -> list[Picks]:
    """Each sequence alone: its prompt (all but the last `decodes` tokens) in one step, then a
    token a step. Eagerly, logits at every position; with `use_graphs`, each step's last
    (the decodes from CUDA graphs)."""
    picks = []
    for seq in sequences:
        n = len(seq) - decodes
        picks += run_forced(engine, [seq], lambda step, i, done, n=n: n if step == 0 else 1,
                            use_graphs=use_graphs, all_positions=not use_graphs)
    return picks


def one_at_a_time(engine: Engine, sequences: Sequence[Sequence[int]], decodes: int) -> list[Picks]:
    """`each_alone`, eagerly; closes the engine after."""
    try:
        return each_alone(engine, sequences, decodes)
    finally:
        engine.close()
        del engine
        torch.cuda.empty_cache()


def gate_engine(checkpoint: Path) -> Engine:
    """The one-GPU golden gates' engine over `checkpoint`: 1024-token context, 16 rows,
    1024 KV blocks, CUDA graphs as the defaults give them."""
    return Engine(EngineConfig(model=str(checkpoint), device="cuda", max_model_len=1024,
                               max_num_seqs=16, num_kv_blocks=1024))


def random_sequences(seed: int, prompt_lens: Sequence[int], decodes: int,
                     vocab: int) -> list[list[int]]:
    """A sequence of `n + decodes` random token ids below `vocab` for each prompt length n."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n + decodes)] for n in prompt_lens]


def record(row: dict[str, object], file: str = "golden_gpu.jsonl") -> None:
    """Print `row` and append it to `file` under $OPENINFER_GPU_RESULTS."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    with (RESULTS / file).open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(row)


def assert_within(row: dict[str, object], bounds: dict[str, float] = GOLDEN_BOUNDS) -> None:
    for key, bound in bounds.items():
        assert row[key] <= bound, (key, row)  # type: ignore[operator]


def check_gate(name: str, picks: list[Picks], reference: list[torch.Tensor], which: list[int],
               bounds: dict[str, float] = GOLDEN_BOUNDS, file: str = "golden_gpu.jsonl") -> None:
    """`gate_row` of `picks` against `reference`, recorded with `bounds`, then held to them."""
    row = gate_row(name, picks, reference, which)
    record(row | {"bounds": bounds}, file)
    assert_within(row, bounds)


@torch.inference_mode()
def reference_logprobs(hf: torch.nn.Module, sequences: Sequence[Sequence[int]]
                       ) -> list[torch.Tensor]:
    """A transformers model's logprobs (its forward, fp32 log-softmax) at every position of
    each sequence, kept on the host; frees the model's device memory after."""
    out = []
    for seq in sequences:
        logits = hf(input_ids=torch.tensor([list(seq)], device="cuda")).logits[0]
        out.append(torch.log_softmax(logits.float(), dim=-1).cpu())
    del hf
    torch.cuda.empty_cache()
    return out


def in_fresh_process(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a new (spawned) process, its result back through a file; `fn` must be
    importable by name (a module on sys.path)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.pt"
        process = multiprocessing.get_context("spawn").Process(
            target=_save_result, args=(fn, args, out))
        process.start()
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"{fn.__name__} failed in its own process (exit code "
                               f"{process.exitcode}; its traceback is in the log above)")
        result: T = torch.load(out, weights_only=False)
        return result


def _save_result(fn: Callable[..., Any], args: tuple[Any, ...], out: Path) -> None:
    torch.save(fn(*args), out)


def position_distance(pa: Picks, pb: Picks, k: int) -> tuple[float, list[float], bool]:
    """Position k of two runs of ours: the regret of b's pick among a's top 8 (a's 8th
    logprob standing in where b's pick is not among them), the |Δ logprob| of the ids both
    top-8 lists share, and whether b's pick is outside a's top 8."""
    lp_a = dict(zip(pa.top_ids[k].tolist(), pa.top_logprobs[k].tolist(), strict=True))
    pick = int(pb.top_ids[k, 0])
    regret = pa.top_logprobs[k, 0].item() - lp_a.get(pick, pa.top_logprobs[k, -1].item())
    deltas = [abs(lp_a[i] - lp) for i, lp in zip(pb.top_ids[k].tolist(),
                                                 pb.top_logprobs[k].tolist(), strict=True)
              if i in lp_a]
    return regret, deltas, pick not in lp_a


def pick_distance(a: list[Picks], b: list[Picks]) -> dict[str, float]:
    """Two runs of ours over the same positions: regret of b's pick among a's top 8, and
    |Δ logprob| on the ids both top-8 lists share (mean, p99), with the position count; and
    the positions where b's pick is not in a's top 8 at all, whose |Δ| the mean and p99 cannot
    see (a path wrong at a few positions moves them little: only the regret bound caught the
    fused hc_post + hc_pre's wrong one-token steps)."""
    regrets, deltas, outside = [], [], 0
    for pa, pb in zip(a, b, strict=True):
        assert pa.positions == pb.positions
        for k in range(len(pa.positions)):
            regret, shared, out = position_distance(pa, pb, k)
            regrets.append(regret)
            deltas += shared
            outside += out
    d = torch.tensor(deltas)
    return {"positions": len(regrets), "regret_max": max(regrets),
            "dlogprob_mean": d.mean().item(), "dlogprob_p99": d.quantile(0.99).item(),
            "picks_outside_top8": outside}
