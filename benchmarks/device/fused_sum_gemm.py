"""o_proj and down as the Qwen3 model runs them on one GPU: the product, then the add + RMSNorm
of the residual stream (`linear_add_rms_norm`). With a split-K tile the norm kernel sums the
product's fp32 shares itself, so a split costs no launch of its own; `small_gemm.py` timed the
split sum as a kernel, which is why its table gave o a tile that does not split. Here every
candidate tile runs in the form the model would run it (split K: shares, then
`split_sum_add_rms_norm`; no split: the product, then `fused_add_rms_norm`), beside cuBLAS +
`fused_add_rms_norm` and the current choice (`linear_add_rms_norm` as the model calls it, tile
from `gemm/tiles.py`). Each figure is one pair's share of a CUDA graph over at least 1 GB of
distinct weight copies (as `small_gemm.py`), against the weight bytes over the read bandwidth
measured in the same run. Every result is checked against the plain-torch composition first.
Last, the rows to put in `tiles.SUM_FUSED_TILES`.

Usage: python fused_sum_gemm.py [--rows 1 16] [--shapes '4B o' ...] [--top 5] [--json F]"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
from cuda_timing import graph_per_call_us

from openinfer_kernels.gemm import linear_add_rms_norm, linear_ref, small_batch_tile
from openinfer_kernels.gemm.triton import Tile, linear_add_rms_norm_triton, linear_triton
from openinfer_kernels.norm.reference import fused_add_rms_norm_ref
from openinfer_kernels.norm.triton import fused_add_rms_norm_triton
from openinfer_server.bench.ceiling import measure_ceiling

SHAPES = {  # name: (N, K), weight [N, K]; N is the hidden size the norm runs over
    "4B o": (2560, 4096), "4B down": (2560, 9728),
    "8B o": (4096, 4096), "8B down": (4096, 12288),
}
EPS = 1e-6

Pair = Callable[[torch.Tensor], object]  # weight copy -> (normed, summed)


def candidates(m: int) -> list[Tile]:
    if m == 1:  # the CUDA-core path
        grid = itertools.product((4, 8, 16, 32), (256, 512), (1, 2, 4, 8), (4, 8))
    else:  # tl.dot: 16 columns at least
        grid = itertools.product((16, 32, 64), (128, 256), (1, 2, 4, 8), (4,))
    return [Tile(n, k, s, w) for n, k, s, w in grid]


def tile_pair(tile: Tile, x: torch.Tensor, residual: torch.Tensor, norm_w: torch.Tensor) -> Pair:
    """The product at `tile` and the add + norm, as `linear_add_rms_norm` would run them."""
    if tile.split_k > 1:
        return lambda w: linear_add_rms_norm_triton(x, w, tile, residual, norm_w, EPS)
    return lambda w: fused_add_rms_norm_triton(linear_triton(x, w, tile), residual, norm_w, EPS)


def describe_current(x: torch.Tensor, w: torch.Tensor) -> str:
    tile = small_batch_tile(x, w, sum_fused=True)
    if tile is None:
        return "cuBLAS + add-norm"
    return f"{fmt(tile)} {'sum in the norm' if tile.split_k > 1 else '+ add-norm'}"


def fmt(tile: Tile | None) -> str:
    if tile is None:
        return "None"
    return (f"Tile({tile.block_n}, {tile.block_k}, {tile.split_k}, {tile.num_warps}, "
            f"{tile.num_stages})")


def measure(name: str, m: int, gbps: float, top: int) -> dict[str, Any]:
    """Every candidate at one shape and row count; prints the best `top` and the baselines."""
    n, k = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(n + k + m)
    w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    copies = [w] + [w.clone() for _ in range(max(3, -(-(1 << 30) // w.nbytes)) - 1)]
    x = torch.randn((m, k), device="cuda", dtype=torch.bfloat16, generator=g)
    residual = torch.randn((m, n), device="cuda", dtype=torch.bfloat16, generator=g)
    norm_w = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).bfloat16()
    want = fused_add_rms_norm_ref(linear_ref(x, w), residual, norm_w, EPS)
    floor_us = n * k * 2 / (gbps * 1e9) * 1e6

    def timed(pair: Pair) -> float:
        got = pair(w)
        assert isinstance(got, tuple)
        for a, b in zip(got, want, strict=True):  # bf16: the product and sum rounded once
            torch.testing.assert_close(a.float(), b.float(), rtol=2**-5, atol=5e-2)
        return graph_per_call_us([lambda c=c: pair(c) for c in copies])

    current = timed(lambda w: linear_add_rms_norm(x, w, residual, norm_w, EPS))
    cublas = timed(lambda w: fused_add_rms_norm_triton(F.linear(x, w), residual, norm_w, EPS))
    results: list[tuple[float, Tile]] = []
    for tile in candidates(m):
        try:
            results.append((timed(tile_pair(tile, x, residual, norm_w)), tile))
        except triton.runtime.errors.OutOfResources:
            continue
    results.sort(key=lambda r: r[0])
    print(f"{name} ({n} x {k}) M={m}: floor {floor_us:.1f} us", flush=True)
    print(f"  current   {current:7.1f} us ({current / floor_us:4.2f}x)  "
          f"{describe_current(x, w)}")
    print(f"  cuBLAS    {cublas:7.1f} us ({cublas / floor_us:4.2f}x)  + add-norm")
    for us, tile in results[:top]:
        print(f"  candidate {us:7.1f} us ({us / floor_us:4.2f}x)  {fmt(tile)}")
    best_us, best_tile = results[0]
    best: Tile | None = best_tile if best_us < cublas else None
    return {"shape": name, "n": n, "k": k, "m": m, "floor_us": floor_us, "current_us": current,
            "cublas_us": cublas, "best_us": min(best_us, cublas), "best": fmt(best),
            "tiles": [{"tile": fmt(t), "us": us} for us, t in results]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES))
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    ceiling = measure_ceiling(torch.device("cuda"))
    print(f"read bandwidth {ceiling.read_gbps:.0f} GB/s on {ceiling.gpu}", flush=True)
    rows = [measure(name, m, ceiling.read_gbps, args.top)
            for name in args.shapes for m in args.rows]
    print("\nSUM_FUSED_TILES rows, best per shape (tile at M = 1, tile at M = 16; None: cuBLAS;"
          " only shapes where the best beats the current choice):")
    for name in args.shapes:
        mine = {r["m"]: r for r in rows if r["shape"] == name}
        if not any(r["best_us"] < r["current_us"] for r in mine.values()):
            continue
        one, sixteen = (mine[m]["best"] if m in mine else "?" for m in (1, 16))
        gain = ", ".join(f"M={m} {r['current_us']:.1f} -> {r['best_us']:.1f} us"
                         for m, r in sorted(mine.items()))
        print(f"    {SHAPES[name]}: ({one}, {sixteen}),  # {name}: {gain}")
    if args.json:
        args.json.write_text(json.dumps({"ceiling": ceiling.as_dict(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
