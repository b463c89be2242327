"""What a V4-Flash decode step of B rows is expected to read on one tensor-parallel rank, and
the time that takes at a run's measured read bandwidth: the batch-1 weight bytes of a latency
result (`weight_bytes`: the dense weights plus 6 experts a layer) with those 6 experts
replaced by the experts B tokens are expected to touch, routed uniformly:
E (1 - (1 - k / E)^B) of the E = 256 a layer, each a rank's FP4 slice with its E8M0 scales.

Usage: python benchmarks/dsv4_expected_read.py RESULT.json --tp 4 --batch 64 256
(RESULT.json: an `openinfer bench latency` result of V4-Flash, e.g. a run's
latency-dsv4-flash-tp4.json, or the entry of that name in benchmarks/results/.)"""

from __future__ import annotations

import argparse
import json

HIDDEN, INTER, EXPERTS, TOP_K, LAYERS = 4096, 2048, 256, 6, 43  # V4-Flash


def expert_bytes(tp: int) -> int:
    """One routed expert's bytes on a rank: gate and up rows and down, e2m1 codes (half a
    byte) and one E8M0 scale per 32 inputs, the width split over `tp` ranks."""
    inter = INTER // tp
    gate_up = 2 * inter * (HIDDEN // 2 + HIDDEN // 32)
    down = HIDDEN * (inter // 2 + inter // 32)
    return gate_up + down


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("result")
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--entry", default=None, help="the result's key, in a benchmarks/results "
                    "file that holds several")
    args = ap.parse_args()
    with open(args.result) as f:
        run = json.load(f)
    if args.entry:
        run = run[args.entry]
    gbps = run["ceiling"]["read_gbps"]
    expert = expert_bytes(args.tp)
    dense = run["weight_bytes"] - LAYERS * TOP_K * expert
    print(f"expert slice {expert / 2**20:.4f} MiB, dense {dense / 1e9:.2f} GB, "
          f"read {gbps:.0f} GB/s")
    for b in args.batch:
        touched = EXPERTS * (1 - (1 - TOP_K / EXPERTS) ** b)
        total = dense + LAYERS * touched * expert
        ms = total / (gbps * 1e9) * 1e3
        print(f"B={b}: {touched:.1f} experts a layer, {total / 1e9:.1f} GB, {ms:.2f} ms, "
              f"{b / ms * 1e3:,.0f} tok/s")


if __name__ == "__main__":
    main()
