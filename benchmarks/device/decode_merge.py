"""Decode attention with the merge in its own kernel against the merge inside the split kernel
(`paged_decode(fused_merge=...)`, OPENINFER_DECODE_MERGE), at Qwen3-4B heads (32 q / 8 kv,
head_dim 128, bf16, page 16). Each figure is one call's share of a CUDA graph of up to LAYERS
calls (fewer where their caches would pass 2 GB), each over its own layer's cache as in a
decode step, with PDL as the step has it. The fused form is checked against the reference
first. The batch-1 rows are the ones issue 13 is about; the larger batches show what the
fused form costs or saves there.

Usage: python decode_merge.py [--layers 36] [--json F]"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from cuda_timing import graph_per_call_us

sys.path.insert(0, str(Path(__file__).parents[2] / "packages/openinfer-kernels/tests/kernels"))
from paged_cases import QWEN3_4B, build, check, decodes

from openinfer_kernels.attention.triton import num_splits_for, paged_decode

CASES = [(1, 384), (1, 4096), (1, 32768), (4, 4096), (16, 2048), (64, 1024), (256, 1024)]


def per_call_us(batch: int, length: int, layers: int, fused: bool) -> float:
    cases = [build(decodes(*[length] * batch), **QWEN3_4B, dtype=torch.bfloat16, seed=s)
             for s in range(layers)]
    calls = [lambda c=c: paged_decode(*c.args(128**-0.5), fused_merge=fused) for c in cases]
    return graph_per_call_us(calls)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    for reqs in (decodes(1, 17, 300, 4096), decodes(*[2000] * 64)):
        case = build(reqs, **QWEN3_4B, dtype=torch.bfloat16)
        check(paged_decode(*case.args(128**-0.5), fused_merge=True), case, 128**-0.5)
    rows = []
    print(f"{'batch':>5} {'context':>7} {'splits':>6} {'two kernels':>12} {'fused':>9}  change")
    for batch, length in CASES:
        kv_bytes = batch * length * QWEN3_4B["hk"] * QWEN3_4B["d"] * 2 * 2
        layers = min(args.layers, max(4, (2 << 30) // kv_bytes))  # ~2 GB of caches at most
        separate = per_call_us(batch, length, layers, fused=False)
        fused = per_call_us(batch, length, layers, fused=True)
        splits = num_splits_for(batch, QWEN3_4B["hk"], torch.device("cuda"))
        rows.append({"batch": batch, "context": length, "splits": splits,
                     "separate_us": separate, "fused_us": fused})
        print(f"{batch:5d} {length:7d} {splits:6d} {separate:9.1f} us {fused:6.1f} us  "
              f"{fused - separate:+.1f} us", flush=True)
        torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
