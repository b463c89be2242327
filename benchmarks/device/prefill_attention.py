"""Prompt attention at Qwen3-8B heads (32 q / 8 kv, head_dim 128, bf16, page 16): one prompt of
2048 or 8192 tokens, its whole context new, through the Triton kernels at a sweep of tile
settings. `paged_split` is what a step of at most 2048 tokens runs (from a CUDA graph);
`paged_prefill` what a longer one runs. TFLOP/s counts the causal half of QK^T and PV.
`--mixed`: instead, steps of a CUDA graph's 2048-token bucket (launched as its capture did, with
`max_query_len` = 2048) that carry one prompt chunk beside many decodes, through the split
kernel at 64 and 128 rows.
Usage: python prefill_attention.py [--lengths 2048 8192] [--kernels split prefill] [--mixed]
[--json PATH]"""

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


def mixed_step(prompt: int, decodes: int, context: int) -> tuple[torch.Tensor, ...]:
    """One new prompt of `prompt` tokens and `decodes` requests of one query over `context`
    keys each, padded to 2048 tokens as a graph bucket is."""
    lens = [prompt] + [context] * decodes
    queries = [prompt] + [1] * decodes
    pages = [-(-n // PAGE) for n in lens]
    k = torch.randn(sum(pages) + 1, PAGE, HK, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    order = torch.randperm(sum(pages), device="cuda").int() + 1
    tables = torch.zeros(len(lens), max(pages), dtype=torch.int32, device="cuda")
    at = 0
    for i, n in enumerate(pages):
        tables[i, :n] = order[at:at + n]
        at += n
    starts = torch.tensor([0, *itertools.accumulate(queries)], dtype=torch.int32,
                          device="cuda")
    q = torch.randn(2048, HQ, D, device="cuda", dtype=torch.bfloat16)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return q, k, v, tables, seq_lens, starts


def mixed() -> list[dict[str, object]]:
    rows = []
    for prompt, decodes, context in ((1024, 512, 1024), (1536, 512, 4096), (256, 512, 2048),
                                     (1900, 100, 1024), (2048, 0, 0)):
        args = mixed_step(prompt, decodes, context)
        for m, stages in itertools.product((64, 128), (2, 3)):
            fn = functools.partial(paged_split, *args, D ** -0.5, 2048, rows=m,
                                   num_stages=stages)
            row = {"prompt": prompt, "decodes": decodes, "context": context, "rows": m,
                   "num_stages": stages, "ms": round(time_ms(fn, reps=20), 4)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--kernels", nargs="+", choices=["split", "prefill"],
                    default=["split", "prefill"])
    ap.add_argument("--mixed", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.mixed:
        rows = mixed()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return
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
