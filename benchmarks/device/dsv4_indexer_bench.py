"""DeepSeek-V4-Flash's lightning indexer on a prompt step: one request's last T tokens at a
context of C tokens (64 index heads of 128 dims, compression ratio 4, top 512, the paged pool of
the model's KV layout), timed in its two kernels. The scores (`_scores_kernel`) at each
--tiles setting: query tokens a program (1 is a decode step's split; more share each key tile
across a prompt's tokens), entries a tile, warps, and the product's orientation. The ordered
top-k by both methods (`launch_topk`, sorting; `launch_topk_select`, a radix select), their
picks checked equal. Beside the scores, their floor: their FLOPs (T x visible entries x heads x
dims x 2) over the bf16 matmul rate measured in the same run (`openinfer_server.bench.ceiling`,
as `openinfer bench` measures it). Keys in bf16, and with --fp4 also stored in FP4 (the
official checkpoint's indexer keys). Each key format's picks are checked equal across the
settings.

Usage (on the GPU machine, from the repo root):
    python benchmarks/device/dsv4_indexer_bench.py [--tiles 1 8 8:0:4:e 8:128:8:e ...]
        [--cases 8192:8192 8192:65536 8192:524288 1:524288] [--fp4] [--json OUT]
On CPU, the same flow at tiny shapes under the interpreter (times meaningless):
    TRITON_INTERPRET=1 python benchmarks/device/dsv4_indexer_bench.py --dry-run"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import torch
from cuda_timing import median_us

from openinfer_deepseek_v4.kernels.indexer.topk_select_triton import launch_topk_select
from openinfer_deepseek_v4.kernels.indexer.topk_triton import launch_topk
from openinfer_deepseek_v4.kernels.indexer.triton import _launch_scores
from openinfer_deepseek_v4.kernels.quant_sim.storage import Fp4Keys, encode_rows
from openinfer_server.bench.ceiling import measure_ceiling

HEADS, DIM, RATIO, TOP_K, BLOCK = 64, 128, 4, 512, 16


def wall_us(fn: Callable[[], object], reps: int = 1, warmup: int = 1) -> float:
    """--dry-run's stand-in for `median_us`."""
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) * 1e6 / reps


def case(tokens: int, context: int, device: str, heads: int, dim: int,
         seed: int) -> dict[str, object]:
    """One request whose last `tokens` of `context` are this step's: q, weights, a pool of
    every compressed entry (blocks in a shuffled order) and its block table."""
    g = torch.Generator().manual_seed(seed)
    blocks = context // BLOCK
    table = (torch.randperm(blocks, generator=g) + 1).to(torch.int32)[None]
    pool = torch.randn(blocks + 1, BLOCK // RATIO, dim, generator=g).to(torch.bfloat16)
    return {"q": torch.randn(tokens, heads, dim, generator=g).to(torch.bfloat16).to(device),
            "weights": torch.randn(tokens, heads, generator=g).to(device),
            "pool": pool.to(device), "block_tables": table.to(device),
            "positions": torch.arange(context - tokens, context).to(device),
            "requests": torch.zeros(tokens, dtype=torch.int32, device=device)}


def parse_tile(text: str) -> tuple[int, int | None, int, bool]:
    """TOKENS[:ENTRIES[:WARPS[:e]]] -> (tokens a program, entries a tile or None, warps, the
    product with the entries first); ENTRIES 0 is the kernel's default."""
    parts = text.split(":")
    return (int(parts[0]), int(parts[1]) or None if len(parts) > 1 else None,
            int(parts[2]) if len(parts) > 2 else 4, len(parts) > 3 and parts[3] == "e")


def run_case(c: dict[str, object], tiles: list[tuple[int, int | None, int, bool]], fp4: bool,
             timer: Callable, tflops: float) -> list[dict[str, object]]:
    q, weights, pool = c["q"], c["weights"], c["pool"]
    assert isinstance(q, torch.Tensor) and isinstance(pool, torch.Tensor)
    assert isinstance(weights, torch.Tensor)
    tokens, context = q.shape[0], int(c["positions"][-1]) + 1  # type: ignore[index]
    entries = context // RATIO
    visible = sum(min((p + 1) // RATIO, entries)
                  for p in range(context - tokens, context))
    floor_us = visible * q.shape[1] * q.shape[2] * 2 / tflops / 1e6
    formats: list[tuple[str, torch.Tensor, Fp4Keys | None]] = [("bf16", pool, None)]
    if fp4:
        fmt = Fp4Keys(pool.shape[-1])
        stored = encode_rows(pool.flatten(0, 1), fmt).view(*pool.shape[:2], fmt.row_bytes)
        formats.append(("fp4", stored, fmt))
    paged: dict[str, object] = {"block_tables": c["block_tables"], "requests": c["requests"],
                                "positions": c["positions"], "ratio": RATIO,
                                "block_size": BLOCK, "slots_per_block": pool.shape[1],
                                "as_slots": False}
    rows = []
    first_picks: dict[str, torch.Tensor] = {}  # each key format's picks at its first setting
    scores = torch.empty(tokens, entries, dtype=torch.float32, device=q.device)
    out = torch.empty(tokens, TOP_K, dtype=torch.int32, device=q.device)
    for name, keys, fmt in formats:
        for n, block_e, warps, first in tiles:
            def scores_call(keys: torch.Tensor = keys, fmt: Fp4Keys | None = fmt, n: int = n,
                            block_e: int | None = block_e, warps: int = warps,
                            first: bool = first) -> None:
                _launch_scores(q, weights, keys.flatten(0, 1), scores, 0.01, paged, fmt, n,
                               block_e, warps, first)
            us = timer(scores_call)
            scores_call()
            launch_topk(scores, c["positions"], out, RATIO, paged)  # type: ignore[arg-type]
            same = torch.equal(out, first_picks.setdefault(name, out.clone()))
            label = f"{n:2d} tokens a program" + (
                "" if block_e is None and warps == 4 else f", {block_e or 'default'} entries"
                f" a tile, {warps} warps") + (", entries first" if first else "")
            row = {"tokens": tokens, "context": context, "keys": name, "per_program": n,
                   "block_e": block_e, "warps": warps, "entries_first": first,
                   "scores_us": round(us, 1), "floor_us": round(floor_us, 1),
                   "x_floor": round(us / floor_us, 2), "same_picks": bool(same)}
            rows.append(row)
            print(f"T={tokens} C={context} {name} keys, {label}: scores "
                  f"{us:10.1f} us ({us / floor_us:5.2f}x the matmul floor {floor_us:.1f} us)"
                  f"{'' if same else '  PICKS DIFFER'}", flush=True)
    topk_us = timer(lambda: launch_topk(scores, c["positions"], out, RATIO,  # type: ignore[arg-type]
                                        paged))
    launch_topk(scores, c["positions"], out, RATIO, paged)  # type: ignore[arg-type]
    sorted_picks = out.clone()
    select_us = timer(lambda: launch_topk_select(scores, c["positions"],  # type: ignore[arg-type]
                                                 out, RATIO, paged))
    same = torch.equal(out, sorted_picks)
    rows.append({"tokens": tokens, "context": context, "topk_us": round(topk_us, 1),
                 "select_us": round(select_us, 1), "select_same_picks": bool(same)})
    print(f"T={tokens} C={context} top-{TOP_K}: sort {topk_us:10.1f} us, radix select "
          f"{select_us:10.1f} us{'' if same else '  PICKS DIFFER'}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiles", nargs="+", default=["1", "8", "16", "8:0:4:e", "16:0:4:e",
                                                  "8:128:8", "8:128:8:e", "16:128:8:e"],
                    help="scores launches: TOKENS[:ENTRIES[:WARPS[:e]]] (query tokens a "
                    "program, entries a tile (0: the kernel's), warps, e: the product with "
                    "the entries first)")
    ap.add_argument("--cases", nargs="+", default=["8192:8192", "8192:65536", "8192:524288",
                                                   "1:524288"],
                    help="TOKENS:CONTEXT pairs")
    ap.add_argument("--fp4", action="store_true", help="also keys stored in FP4")
    ap.add_argument("--json")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes on CPU under TRITON_INTERPRET=1: checks the flow only")
    args = ap.parse_args()
    if args.dry_run:
        if os.environ.get("TRITON_INTERPRET") != "1":
            ap.error("--dry-run runs the kernels under the interpreter: set TRITON_INTERPRET=1")
        device, heads, dim, timer, tflops = "cpu", 4, 32, wall_us, 1.0
        cases = [(8, 256)]
    else:
        device, heads, dim, timer = "cuda", HEADS, DIM, median_us
        tflops = measure_ceiling(torch.device("cuda")).matmul_tflops
        print(f"{torch.cuda.get_device_name()}: bf16 matmul {tflops:.0f} TFLOP/s", flush=True)
        cases = [tuple(int(x) for x in c.split(":")) for c in args.cases]
    rows: list[dict[str, object]] = []
    with torch.inference_mode():
        for i, (tokens, context) in enumerate(cases):
            c = case(tokens, context, device, heads, dim, seed=i)
            tiles = [t for t in map(parse_tile, args.tiles) if t[0] <= max(tokens, 1)]
            rows += run_case(c, tiles, args.fp4, timer, tflops)
            del c
            if device == "cuda":
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tflops": tflops, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
