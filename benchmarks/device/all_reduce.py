"""All-reduce micro-benchmark on N GPUs: NCCL against torch's symmetric-memory one-shot and
two-shot kernels (`openinfer_core.distributed.all_reduce`), bf16, 8 KB to 32 MB, each path
captured in a CUDA graph of `CALLS` back-to-back all-reduces (as a decode step replays them)
and timed by replaying it (`cuda_timing.graph_per_call_us`: the best of `REPLAYS`). The
ceiling beside it, in the same run: the peer-to-peer copy bandwidth between GPU 0 and GPU 1 (a
256 MB copy), what one link direction moves.

Each row gives the time of one all-reduce and its bus bandwidth (NCCL's convention: size ×
2(n-1)/n per time) as a fraction of that copy bandwidth. Before timing, each path's sums are
checked against a float64 sum of the ranks' inputs, over CALLS calls that reuse the buffers.

    python3 benchmarks/device/all_reduce.py --gpus 2 --json OUT.json"""

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

SIZES = [8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20,
         2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20]
CALLS = 20  # all-reduces per graph
REPLAYS = 20  # timed replays of the graph, the best kept
PATHS = ("nccl", "one_shot", "two_shot")


def _rank(rank: int, size: int, store: str, out: str) -> None:
    from openinfer_core.distributed import all_reduce as ar
    from openinfer_core.distributed.group import TorchTensorParallelGroup

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    # The largest size through every path: the buffer must hold 32 MB.
    ar.ONE_SHOT_MAX[size] = ar.TWO_SHOT_MAX[size] = max(SIZES)
    group = TorchTensorParallelGroup(rank, size, device, Path(store), 120.0)
    symmetric = group._symmetric
    rows = []
    for nbytes in SIZES:
        n = nbytes // 2
        for path in PATHS:
            if path != "nccl" and symmetric is None:
                continue
            if path == "two_shot" and nbytes % (ar.ALIGN_BYTES * size):
                continue
            rows.append(_measure(group, symmetric, path, n, rank, size, device))
    group.close()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))


def _reduce(group, symmetric, path: str, x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    if path == "nccl":
        torch.distributed.all_reduce(x)
        return x
    return symmetric(x, path)


def _measure(group, symmetric, path: str, n: int, rank: int, size: int,  # type: ignore[no-untyped-def]
             device: torch.device) -> dict[str, object]:
    gen = torch.Generator(device=device).manual_seed(1000 * rank + n)
    inputs = [torch.randn(n, device=device, generator=gen).to(torch.bfloat16)
              for _ in range(CALLS)]
    # Correctness first, eagerly over the same buffers: each sum against float64 of all ranks'.
    worst = 0.0
    for x in inputs[:4]:
        got = _reduce(group, symmetric, path, x.clone()).double()
        parts = [torch.empty_like(x) for _ in range(size)]
        torch.distributed.all_gather(parts, x)
        want = torch.stack([p.double() for p in parts]).sum(0)
        worst = max(worst, ((got - want).abs() / want.abs().clamp_min(1e-2)).max().item())
    work = [x.clone() for x in inputs]
    torch.distributed.barrier()
    us = graph_per_call_us([lambda x=x: _reduce(group, symmetric, path, x) for x in work],
                           replays=REPLAYS)
    nbytes = n * 2
    return {"path": path, "bytes": nbytes, "us": round(us, 2),
            "busbw_gbs": round(nbytes * 2 * (size - 1) / size / us / 1e3, 1),
            "max_rel_err": worst}


def peer_copy_gbs() -> float:
    """GB/s of a 256 MB copy from GPU 1 to GPU 0 (the best of 5)."""
    src = torch.empty(256 << 20, dtype=torch.uint8, device="cuda:1")
    dst = torch.empty_like(src, device="cuda:0")
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        best = min(best, start.elapsed_time(end) / 1000)
    return src.numel() / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.gpus < 2 or torch.cuda.device_count() < args.gpus:
        sys.exit(f"needs {args.gpus} >= 2 GPUs; this machine has {torch.cuda.device_count()}")
    ceiling = peer_copy_gbs()
    folder = tempfile.mkdtemp(prefix="openinfer-ar-")
    out = os.path.join(folder, "rows.json")
    mp.spawn(_rank, args=(args.gpus, os.path.join(folder, "store"), out), nprocs=args.gpus)
    rows = json.loads(Path(out).read_text())
    best: dict[int, tuple[str, float]] = {}
    print(f"{args.gpus} GPUs, {torch.cuda.get_device_name(0)}; peer copy {ceiling:.0f} GB/s")
    print(f"{'bytes':>10} {'path':>9} {'us':>8} {'busbw GB/s':>11} {'of copy':>8} {'rel err':>9}")
    for row in rows:
        row["of_peer_copy"] = round(row["busbw_gbs"] / ceiling, 3)
        print(f"{row['bytes']:>10} {row['path']:>9} {row['us']:>8.2f} {row['busbw_gbs']:>11.1f} "
              f"{row['of_peer_copy']:>8.2f} {row['max_rel_err']:>9.1e}")
        if row["bytes"] not in best or row["us"] < best[row["bytes"]][1]:
            best[row["bytes"]] = (row["path"], row["us"])
    print("fastest: " + ", ".join(f"{b >> 10} KB {p}" for b, (p, _) in best.items()))
    if args.json:
        args.json.write_text(json.dumps({"gpus": args.gpus, "gpu": torch.cuda.get_device_name(0),
                                         "peer_copy_gbs": round(ceiling, 1), "rows": rows},
                                        indent=1))


if __name__ == "__main__":
    main()
