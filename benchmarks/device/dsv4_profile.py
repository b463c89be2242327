"""Where a DeepSeek-V4 decode step's GPU time goes, kernel by kernel: V4-Flash widths cut to
--layers layers (window, CSA, HCA in turn), B requests of --context tokens, a few eager decode
steps under torch.profiler; each kernel's device time summed by name, per step and layer, with
the graph-replayed step beside it (its gap to the kernels' sum is launch spacing inside the
graph). Kernel times are the GPU's own, so they hold for the captured step too.

Usage: python dsv4_profile.py [--layers 3] [--batches 1,64] [--context 2048] [--top 30]
       [--json OUT]"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch
from cuda_timing import graph_per_call_us
from dsv4_decode import decode_step, make_engine
from torch.profiler import ProfilerActivity, profile

STEPS = 5


def kernel_table(engine, batch: int, context: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    model = engine.model
    layers = len(model.w.layers)
    with torch.inference_mode(), decode_step(engine, batch, context) as step:
        for _ in range(3):
            model.forward(step)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                model.forward(step)
            torch.cuda.synchronize()
        graph_us = graph_per_call_us([lambda: model.forward(step)])
    per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type.name != "CUDA":
            continue
        entry = per_name[event.name[:90]]
        entry[0] += event.device_time / STEPS
        entry[1] += 1 / STEPS
    total = sum(v[0] for v in per_name.values())
    rows = sorted(({"kernel": k, "us_per_step": v[0], "calls_per_step": v[1]}
                   for k, v in per_name.items()), key=lambda r: -float(r["us_per_step"]))
    return {"batch": batch, "layers": layers, "kernel_us_per_step": total,
            "kernels_per_step": sum(v[1] for v in per_name.values()),
            "graph_us_per_step": graph_us, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    engine = make_engine(args.layers, max(batches), args.context)
    tables = []
    for b in batches:
        t = kernel_table(engine, b, args.context)
        tables.append(t)
        print(f"\nbatch {b}, {t['layers']} layers, context {args.context}: kernels "
              f"{t['kernel_us_per_step']:.0f} us/step ({t['kernels_per_step']:.0f} launches), "
              f"graph replay {t['graph_us_per_step']:.0f} us/step")
        print(f"{'us/step':>9s} {'calls':>6s}  kernel")
        for r in t["rows"][:args.top]:  # type: ignore[index]
            print(f"{r['us_per_step']:9.1f} {r['calls_per_step']:6.0f}  {r['kernel']}")
    if args.json:
        Path(args.json).write_text(json.dumps(tables, indent=1))


if __name__ == "__main__":
    main()
