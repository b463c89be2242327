"""All-reduce + residual add + RMSNorm on N GPUs, fused (FlashInfer's, `distributed/add_norm.py`;
ours, one Triton kernel over symmetric memory, `distributed/symmetric_add_norm.py`, and its
push form up to 64 rows, data-signalled and flag-signalled, `push-flags`) against the
unfused path a row-split layer takes without them (the group's all-reduce, then
`fused_add_rms_norm`), bf16, rows of `--hidden` values, 1 to 2048 rows. Each path is captured
in a CUDA graph of `CALLS` back-to-back calls (as a decode step replays them) and timed by
replaying it (`cuda_timing.graph_per_call_us`: the best of `REPLAYS`). A fusion that is not
available (FlashInfer not installed) or does not take a size (ours past its buffer) is left out
of that row.

Before timing, each fusion's outputs are checked against the unfused ones on the same inputs
(all against a float64 reference): the norm's and the new residual's largest error.

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
FUSIONS = ("flashinfer", "triton", "push", "push-flags")


def _rank(rank: int, size: int, hidden: int, fusions: list[str], store: str, out: str) -> None:
    from openinfer_core.distributed.add_norm import FUSED_NORM_ENV
    from openinfer_core.distributed.group import TorchTensorParallelGroup
    from openinfer_core.distributed.symmetric_add_norm import SymmetricAddNorm
    from openinfer_kernels import fused_add_rms_norm
    from openinfer_kernels.collective import all_reduce_add_rms_norm, all_reduce_add_rms_norm_push

    os.environ[FUSED_NORM_ENV] = "flashinfer" if "flashinfer" in fusions else "off"
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    group = TorchTensorParallelGroup(rank, size, device, Path(store), 120.0)
    group.enable_add_rms_norm(hidden, torch.bfloat16)
    fused = {"flashinfer": group._fused}
    if "triton" in fusions:  # ours beside FlashInfer's, on the all-reduce's symmetric memory
        fused["triton"] = SymmetricAddNorm.open(group._symmetric, all_reduce_add_rms_norm,
                                                hidden, torch.bfloat16, device)
    if "push" in fusions:  # the push kernel to its rows, then the one-shot (`push` mode)
        fused["push"] = SymmetricAddNorm.open(group._symmetric, all_reduce_add_rms_norm,
                                              hidden, torch.bfloat16, device,
                                              all_reduce_add_rms_norm_push)
    if "push-flags" in fusions:  # the same, its rows signalled by flags
        from openinfer_kernels.collective.push_triton import PushAddNorm

        fused["push-flags"] = SymmetricAddNorm.open(group._symmetric, all_reduce_add_rms_norm,
                                                    hidden, torch.bfloat16, device,
                                                    PushAddNorm("flags"))
    fused = {name: f for name, f in fused.items() if f is not None}
    if not fused:
        if rank == 0:
            Path(out).write_text(json.dumps({"error": "no fused kernel is available (see the "
                                                      "log)"}))
        group.close()
        return
    weight = (1 + 0.1 * torch.randn(hidden, device=device)).to(torch.bfloat16)
    torch.distributed.broadcast(weight, 0)

    def unfused(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return fused_add_rms_norm(group.all_reduce(x), r, weight, EPS)

    paths = {"unfused": unfused}
    for name, f in fused.items():
        paths[name] = lambda x, r, f=f: f(x, r, weight, EPS)
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
        # Every rank skips the same fusions: `fits` answers alike for the same shape.
        taken = {name: fn for name, fn in paths.items()
                 if name == "unfused" or fused[name].fits(xs[0])}
        row: dict[str, object] = {"rows": t, "hidden": hidden,
                                  **_errors(xs[0], rs[0], weight, taken, size)}
        torch.distributed.barrier()
        for name, fn in taken.items():
            row[f"{name}_us"] = round(graph_per_call_us(
                [lambda x=x, r=r, fn=fn: fn(x, r) for x, r in zip(xs, rs, strict=True)],
                replays=REPLAYS), 2)
        rows.append(row)
    group.close()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))


def _errors(x, r, weight, paths, size: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Each path's largest |error| against float64 (the norm, the new residual)."""
    parts = [torch.empty_like(x) for _ in range(size)]
    torch.distributed.all_gather(parts, x)
    summed = torch.stack([p.double() for p in parts]).sum(0) + r.double()
    normed = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + EPS) * weight.double()
    out = {}
    for name, fn in paths.items():
        got_norm, got_sum = fn(x.clone(), r.clone())  # NCCL sums in place
        out[f"{name}_norm_err"] = (got_norm.double() - normed).abs().max().item()
        out[f"{name}_residual_err"] = (got_sum.double() - summed).abs().max().item()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--fused", default=",".join(FUSIONS),
                        help=f"the fusions to time beside the unfused path, of {FUSIONS}")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    fusions = args.fused.split(",")
    if not set(fusions) <= set(FUSIONS):
        sys.exit(f"--fused {args.fused}: choose from {','.join(FUSIONS)}")
    if args.gpus < 2 or torch.cuda.device_count() < args.gpus:
        sys.exit(f"needs {args.gpus} >= 2 GPUs; this machine has {torch.cuda.device_count()}")
    folder = tempfile.mkdtemp(prefix="openinfer-addnorm-")
    out = os.path.join(folder, "rows.json")
    mp.spawn(_rank, args=(args.gpus, args.hidden, fusions, os.path.join(folder, "store"), out),
             nprocs=args.gpus)
    rows = json.loads(Path(out).read_text())
    if isinstance(rows, dict):
        sys.exit(rows["error"])
    print(f"{args.gpus} GPUs, {torch.cuda.get_device_name(0)}; hidden {args.hidden}, bf16; "
          "us per call (x unfused), largest error of the norm / the residual against float64")
    names = ["unfused", *(f for f in fusions if any(f"{f}_us" in row for row in rows))]
    print(f"{'rows':>6} " + " ".join(f"{name:>29}" for name in names))
    for row in rows:
        cells = []
        for name in names:
            us = row.get(f"{name}_us")
            cells.append(f"{'-':>29}" if us is None else
                         f"{us:>7.2f} {us / row['unfused_us']:>4.2f}x "
                         f"{row[f'{name}_norm_err']:.1e}/{row[f'{name}_residual_err']:.1e}")
        print(f"{row['rows']:>6} " + " ".join(cells))
    if args.json:
        args.json.write_text(json.dumps({"gpus": args.gpus, "gpu": torch.cuda.get_device_name(0),
                                         "hidden": args.hidden, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
