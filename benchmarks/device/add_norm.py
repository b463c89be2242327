"""All-reduce + residual add + RMSNorm on N GPUs, fused (FlashInfer, `distributed/add_norm.py`)
against the unfused path a row-split layer takes without it (the group's all-reduce, then
`fused_add_rms_norm`), bf16, rows of `--hidden` values, 1 to 2048 rows. Each path is captured
in a CUDA graph of `CALLS` back-to-back calls (as a decode step replays them) and timed by
replaying it (`cuda_timing.graph_per_call_us`: the best of `REPLAYS`).

Before timing, the fused outputs are checked against the unfused ones on the same inputs
(both against a float64 reference): the norm's and the new residual's largest error.

    python3 benchmarks/device/add_norm.py --gpus 2 --hidden 4096 --json OUT.json"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp
from cuda_timing import graph_per_call_us

ROWS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
CALLS = 20  # calls per graph
REPLAYS = 20  # timed replays of the graph, the best kept
EPS = 1e-6


def _rank(rank: int, size: int, hidden: int, store: str, out: str) -> None:
    from openinfer_core.distributed.add_norm import FUSED_NORM_ENV
    from openinfer_core.distributed.group import TorchTensorParallelGroup
    from openinfer_kernels import fused_add_rms_norm

    os.environ[FUSED_NORM_ENV] = "flashinfer"
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    group = TorchTensorParallelGroup(rank, size, device, Path(store), 120.0)
    group.enable_add_rms_norm(hidden, torch.bfloat16)
    if group._fused is None:
        if rank == 0:
            Path(out).write_text(json.dumps({"error": "the fused kernel is unavailable (see "
                                                      "the log)"}))
        group.close()
        return
    weight = (1 + 0.1 * torch.randn(hidden, device=device)).to(torch.bfloat16)

    def unfused(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return fused_add_rms_norm(group.all_reduce(x), r, weight, EPS)

    def fused(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        got = group.all_reduce_add_rms_norm(x, r, weight, EPS)
        assert got is not None
        return got

    rows = []
    for t in ROWS:
        gen = torch.Generator(device=device).manual_seed(1000 * rank + t)
        xs = [torch.randn(t, hidden, device=device, generator=gen).to(torch.bfloat16)
              for _ in range(CALLS)]
        # The residual is the same on every rank (as in the model): rank 0's, broadcast.
        rs = [torch.randn(t, hidden, device=device, generator=gen).to(torch.bfloat16)
              for _ in range(CALLS)]
        for r in rs:
            torch.distributed.broadcast(r, 0)
        errors = _errors(group, xs[0], rs[0], weight, unfused, fused, size)
        torch.distributed.barrier()
        times = {}
        for name, fn in (("unfused", unfused), ("fused", fused)):
            times[name] = graph_per_call_us(
                [lambda x=x, r=r, fn=fn: fn(x, r) for x, r in zip(xs, rs, strict=True)],
                replays=REPLAYS)
        rows.append({"rows": t, "hidden": hidden, "unfused_us": round(times["unfused"], 2),
                     "fused_us": round(times["fused"], 2), **errors})
    group.close()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))


def _errors(group, x, r, weight, unfused, fused, size: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Each path's largest |error| against float64 (the norm, the new residual)."""
    parts = [torch.empty_like(x) for _ in range(size)]
    torch.distributed.all_gather(parts, x)
    summed = torch.stack([p.double() for p in parts]).sum(0) + r.double()
    normed = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + EPS) * weight.double()
    out = {}
    for name, fn in (("unfused", unfused), ("fused", fused)):
        got_norm, got_sum = fn(x.clone(), r.clone())  # NCCL sums in place
        out[f"{name}_norm_err"] = (got_norm.double() - normed).abs().max().item()
        out[f"{name}_residual_err"] = (got_sum.double() - summed).abs().max().item()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.gpus < 2 or torch.cuda.device_count() < args.gpus:
        sys.exit(f"needs {args.gpus} >= 2 GPUs; this machine has {torch.cuda.device_count()}")
    folder = tempfile.mkdtemp(prefix="openinfer-addnorm-")
    out = os.path.join(folder, "rows.json")
    mp.spawn(_rank, args=(args.gpus, args.hidden, os.path.join(folder, "store"), out),
             nprocs=args.gpus)
    rows = json.loads(Path(out).read_text())
    if isinstance(rows, dict):
        sys.exit(rows["error"])
    print(f"{args.gpus} GPUs, {torch.cuda.get_device_name(0)}; hidden {args.hidden}, bf16")
    print(f"{'rows':>6} {'unfused us':>11} {'fused us':>9} {'ratio':>6} {'norm err u/f':>16} "
          f"{'residual err u/f':>18}")
    for row in rows:
        print(f"{row['rows']:>6} {row['unfused_us']:>11.2f} {row['fused_us']:>9.2f} "
              f"{row['fused_us'] / row['unfused_us']:>6.2f} "
              f"{row['unfused_norm_err']:>7.1e}/{row['fused_norm_err']:.1e} "
              f"{row['unfused_residual_err']:>9.1e}/{row['fused_residual_err']:.1e}")
    if args.json:
        args.json.write_text(json.dumps({"gpus": args.gpus, "gpu": torch.cuda.get_device_name(0),
                                         "hidden": args.hidden, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
