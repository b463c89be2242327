"""Decode attention at serving shapes (Qwen3-8B heads: 32 q / 8 kv, head_dim 128, bf16, page 16):
achieved KV read bandwidth of `paged_decode` for a few tile settings and split counts.
Usage: python decode_attention.py [--json PATH]"""

from __future__ import annotations

import argparse
import functools
import itertools
import json

import torch

from openinfer_kernels.attention.triton import num_splits_for, paged_decode

HQ, HK, D, PAGE = 32, 8, 128, 16


def case(batch: int, length: int) -> tuple[torch.Tensor, ...]:
    blocks_per_seq = -(-length // PAGE)
    num_blocks = batch * blocks_per_seq + 1
    k = torch.randn(num_blocks, PAGE, HK, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    perm = torch.randperm(num_blocks - 1, device="cuda")[: batch * blocks_per_seq] + 1
    tables = perm.view(batch, blocks_per_seq).int()
    q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    starts = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    return q, k, v, tables, seq_lens, starts


def time_ms(fn, reps: int = 20) -> float:  # type: ignore[no-untyped-def]
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for batch, length in [(1, 4096), (1, 32768), (32, 2048), (128, 3072), (256, 1024)]:
        q, k, v, tables, seq_lens, starts = case(batch, length)
        kv_bytes = 2 * batch * length * HK * D * 2
        default = num_splits_for(batch, HK, q.device)
        for splits, block_n, warps, stages in itertools.product(
                sorted({default, 2 * default, 4 * default}), (32, 64, 128), (4, 8), (2, 3)):
            if splits > 32:
                continue
            ms = time_ms(functools.partial(
                paged_decode, q, k, v, tables, seq_lens, starts, D ** -0.5, splits,
                block_n=block_n, num_warps=warps, num_stages=stages))
            rows.append({"batch": batch, "length": length, "splits": splits,
                         "default_splits": default, "block_n": block_n, "warps": warps,
                         "stages": stages, "ms": ms, "tbps": kv_bytes / ms / 1e9})
        best = max((r for r in rows if r["batch"] == batch and r["length"] == length),
                   key=lambda r: r["tbps"])
        base = next(r for r in rows if r["batch"] == batch and r["length"] == length
                    and r["splits"] == default and r["block_n"] == 64 and r["warps"] == 4
                    and r["stages"] == 2)
        print(f"B={batch:4d} L={length:6d}: current {base['tbps']:.2f} TB/s ({base['ms']:.3f} ms)"
              f"  best {best['tbps']:.2f} TB/s with splits {best['splits']} block_n "
              f"{best['block_n']} warps {best['warps']} stages {best['stages']}")
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
