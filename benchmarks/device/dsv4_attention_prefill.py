"""DeepSeek-V4-Flash's sparse attention on a prompt step, on CUDA: one request's T tokens
(`sparse_sink_attention`, 512-dim MQA rows, a 128-entry window) at the plan's tile and at
candidate ones. CSA: each token's 512 picks among its visible compressed entries (ratio 4).
HCA: every visible entry (ratio 128) of a context of C tokens. Entries in bf16, and stored as
the official FP8 rows (`Fp8Entries`, decoded as read: what `OPENINFER_DSV4_QUANT_SIM` turns on).
Heads: 64 (one GPU) or a TP rank's share (--heads 32 at TP2).

Each time is printed against its floor, the products' FLOPs (T x rows x heads x 512 x 4) over
the bf16 matmul rate measured in the same run. Every tile's output is checked against the
plan's.

Usage: python dsv4_attention_prefill.py [--tokens 8192] [--context 65536] [--heads 64 32]
[--json F]"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import torch
from cuda_timing import median_us

from openinfer_deepseek_v4.kernels.quant_sim.storage import Fp8Entries, encode_rows
from openinfer_deepseek_v4.kernels.sparse_attention.triton import (
    plan,
    sparse_sink_attention_triton,
)
from openinfer_server.bench.ceiling import measure_ceiling

DIM, ROPE, WINDOW, PICKED = 512, 64, 128, 512
# (block_h, block_n, warps), beside the plan's (`prompt_tile` at these token counts).
TILES = [(16, 32, 4), (16, 64, 8), (32, 32, 8), (32, 64, 8), (64, 16, 8), (64, 32, 8)]


@dataclass
class Case:
    q: torch.Tensor
    kv_pool: torch.Tensor
    entry_pool: torch.Tensor
    window: torch.Tensor
    slots: torch.Tensor
    sinks: torch.Tensor
    rows: int  # (token, row) pairs read: the products' size


def case(tokens: int, context: int, heads: int, kind: str) -> Case:
    """The last `tokens` tokens of a `context`-token request: q, the raw-entry pool and each
    token's window, the compressed-entry pool and each token's entries (-1 past them)."""
    g = torch.Generator("cuda").manual_seed(tokens + context + heads)
    ratio = 4 if kind == "csa" else 128
    positions = torch.arange(context - tokens, context, device="cuda")
    visible = (positions + 1) // ratio
    entries = int(visible.max())
    kv_pool = torch.randn(context, DIM, generator=g, device="cuda").to(torch.bfloat16)
    entry_pool = torch.randn(entries, DIM, generator=g, device="cuda").to(torch.bfloat16)
    window = (positions[:, None] - torch.arange(WINDOW, device="cuda")).int()
    window = torch.where(window >= 0, window, -1)
    if kind == "csa":
        # 512 distinct visible entries a token (random scores' top 512; fewer if it sees fewer)
        scores = torch.rand(tokens, entries, generator=g, device="cuda")
        scores = scores.masked_fill(torch.arange(entries, device="cuda") >= visible[:, None], -1)
        picked = scores.topk(min(PICKED, entries), dim=-1)
        slots = torch.where(picked.values >= 0, picked.indices, -1).int()
    else:
        slots = torch.arange(entries, device="cuda").expand(tokens, -1)
        slots = torch.where(slots < visible[:, None], slots, -1).int().contiguous()
    q = torch.randn(tokens, heads, DIM, generator=g, device="cuda").to(torch.bfloat16)
    rows = int((window >= 0).sum() + (slots >= 0).sum())
    return Case(q, kv_pool, entry_pool, window, slots,
                torch.randn(heads, generator=g, device="cuda"), rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--context", type=int, nargs="+", default=[8192, 65536])
    ap.add_argument("--heads", type=int, nargs="+", default=[64, 32])
    ap.add_argument("--json")
    args = ap.parse_args()
    peak = measure_ceiling(torch.device("cuda")).matmul_tflops
    print(f"bf16 matmul ceiling: {peak:.0f} TFLOP/s", flush=True)
    fmt = Fp8Entries(DIM, ROPE, 2)
    results = []
    for context in args.context:
        for heads in args.heads:
            for kind in ("csa", "hca"):
                c = case(args.tokens, context, heads, kind)
                floor_us = c.rows * heads * DIM * 4 / (peak * 1e12) * 1e6
                stored = encode_rows(c.entry_pool, fmt)
                for name, pool, entry_format in (("bf16", c.entry_pool, None),
                                                 ("fp8", stored, fmt)):
                    planned = plan(args.tokens, heads, DIM, WINDOW + c.slots.shape[1],
                                   torch.device("cuda"), entry_format is not None)
                    def run(tile: tuple[int, int, int] | None = None,
                            pool: torch.Tensor = pool, c: Case = c,
                            entry_format: Fp8Entries | None = entry_format) -> torch.Tensor:
                        h, n, w = tile or (None, None, None)
                        return sparse_sink_attention_triton(
                            c.q, c.kv_pool, pool, c.window, c.slots, c.sinks, DIM ** -0.5,
                            entry_format=entry_format, block_h=h, block_n=n, num_warps=w)
                    want = run()
                    for tile in [None, *TILES]:
                        label = (f"plan h{planned[0]} n{planned[1]} w{planned[3]}"
                                 if tile is None else f"h{tile[0]} n{tile[1]} w{tile[2]}")
                        head = f"T={args.tokens} C={context} H={heads} {kind} {name}: {label:16s}"
                        try:
                            got = run(tile)
                            us = median_us(lambda t=tile: run(t), reps=10, warmup=2)
                        except Exception as exc:  # a tile past the registers or shared memory
                            print(f"{head} failed: {type(exc).__name__}: {exc}"[:300],
                                  flush=True)
                            continue
                        diff = (got.float() - want.float()).abs().max().item()
                        results.append({"context": context, "heads": heads, "kind": kind,
                                        "entries": name, "tile": label, "us": round(us, 1),
                                        "floor_us": round(floor_us, 1), "max_abs_diff": diff})
                        print(f"{head} {us:9.1f} us ({us / floor_us:5.2f}x the floor "
                              f"{floor_us:.1f} us), max |diff| vs plan {diff:.3g}", flush=True)
                del c
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"matmul_tflops": peak, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
