"""Prompt attention at Qwen3-8B heads (32 q / 8 kv, head_dim 128, bf16, page 16): one prompt of
2048 or 8192 tokens, its whole context new, through the Triton kernels at a sweep of tile
settings. `paged_split` is what a step of at most 2048 tokens runs (from a CUDA graph);
`paged_prefill` what a longer one runs. TFLOP/s counts the causal half of QK^T and PV.
Usage: python prefill_attention.py [--lengths 2048 8192] [--kernels split prefill] [--json PATH]"""

from __future__ import annotations

import argparse
import functools
import itertools
import json

import torch
from decode_attention import time_ms

from openinfer_kernels.attention.triton import paged_prefill, paged_split

HQ, HK, D, PAGE = 32, 8, 128, 16


def prompt(length: int) -> tuple[torch.Tensor, ...]:
    pages = -(-length // PAGE)
    k = torch.randn(pages + 1, PAGE, HK, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    tables = (torch.randperm(pages, device="cuda") + 1).view(1, -1).int()
    q = torch.randn(length, HQ, D, device="cuda", dtype=torch.bfloat16)
    seq_lens = torch.tensor([length], dtype=torch.int32, device="cuda")
    starts = torch.tensor([0, length], dtype=torch.int32, device="cuda")
    return q, k, v, tables, seq_lens, starts


def sweep(length: int, names: list[str]) -> list[dict[str, object]]:
    args = prompt(length)
    scale = D ** -0.5
    flops = 2 * 2 * length * length / 2 * D * HQ
    want = paged_prefill(*args, scale, length)  # the baseline settings, for the check
    rows = []
    kernels = {"split": paged_split, "prefill": paged_prefill}
    for name, m, block_n, warps, stages, heavy in itertools.product(
            names, (64, 128), (64, 128), (4, 8), (2, 3), (False, True)):
        tiles = {"block_n": block_n, "num_warps": warps, "num_stages": stages,
                 "heavy_first": heavy, ("rows" if name == "split" else "block_m"): m}
        fn = functools.partial(kernels[name], *args, scale, length, **tiles)
        try:
            out = fn()
            ms = time_ms(fn, reps=10)
        except Exception as e:  # out of shared memory or registers: skip the setting
            print(f"{length} {name} {tiles}: {type(e).__name__}")
            continue
        err = (out.float() - want.float()).abs().max().item()
        row = {"length": length, "kernel": name, **tiles, "ms": round(ms, 4),
               "tflops": round(flops / ms / 1e9, 1), "max_err": err}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--kernels", nargs="+", choices=["split", "prefill"],
                    default=["split", "prefill"])
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = [r for length in args.lengths for r in sweep(length, args.kernels)]
    for length in args.lengths:
        for kernel in args.kernels:
            mine = sorted((r for r in rows if r["length"] == length and r["kernel"] == kernel),
                          key=lambda r: r["ms"])
            for r in mine[:3]:
                print(f"best {length} {kernel}: {r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
