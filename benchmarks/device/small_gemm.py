"""Small-batch linear layers against the read-bandwidth floor: for each of Qwen3-4B/8B's decode
GEMMs at M rows, cuBLAS (`F.linear`) and the best of a grid of Triton tiles; for gate_up also
cuBLAS + `silu_and_mul` against the gated kernel that fuses the activation
(`openinfer_kernels.gemm.triton`), each beside its weight bytes over the bandwidth measured
in the same run. Every Triton result is checked against cuBLAS first. Each figure is one call's
share of a CUDA graph that runs the op back to back over enough distinct copies of the weight
(at least 1 GB) that none is still in the 50 MB L2 when its turn comes, as in a decode step.
(`triton.testing.do_bench` clears L2 with a memset before each call; the dirty lines it leaves
add about 10 us to a 10 us kernel, which hid the kernels' differences in run 35.)

Usage: python small_gemm.py [--rows 1 16] [--json F]"""

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

from openinfer_kernels.activation import silu_and_mul
from openinfer_kernels.gemm.triton import Tile, linear_triton
from openinfer_server.bench.ceiling import measure_ceiling

SHAPES = {  # name: (N, K), weight [N, K]
    "4B qkv": (6144, 2560), "4B o": (2560, 4096), "4B gate_up": (19456, 2560),
    "4B down": (2560, 9728), "4B lm_head": (151936, 2560),
    "8B qkv": (6144, 4096), "8B o": (4096, 4096), "8B gate_up": (24576, 4096),
    "8B down": (4096, 12288), "8B lm_head": (151936, 4096),
}


def per_call_us(op: Callable[[torch.Tensor], object], weights: list[torch.Tensor]) -> float:
    """One call's share of a graph of `op` over every weight, best of 5 replays."""
    for w in weights:
        op(w)  # compiles, and sizes the graph's pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            op(w)
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / len(weights))
    return best


def tiles(m: int) -> list[Tile]:
    if m == 1:  # the CUDA-core path: any column count
        grid = itertools.product((4, 8, 16, 32), (256, 512), (1, 2, 4), (4, 8))
    else:  # tl.dot: 16 columns at least
        grid = itertools.product((16, 32, 64), (128, 256), (1, 2, 4), (4,))
    return [Tile(n, k, s, w) for n, k, s, w in grid]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES))
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    ceiling = measure_ceiling(torch.device("cuda"))
    gbps = ceiling.read_gbps
    rows: list[dict[str, Any]] = []
    print(f"read bandwidth {gbps:.0f} GB/s on {ceiling.gpu}", flush=True)
    for name in args.shapes:
        n, k = SHAPES[name]
        w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16) * 0.02
        copies = [w] + [w.clone() for _ in range(max(3, -(-(1 << 30) // w.nbytes)) - 1)]
        floor_us = n * k * 2 / (gbps * 1e9) * 1e6
        # gate_up also fused with its activation: cuBLAS + silu_and_mul against one kernel.
        for gated in (False, True) if "gate_up" in name else (False,):
            for m in args.rows:
                x = torch.randn((m, k), device="cuda", dtype=torch.bfloat16)

                def ours(w: torch.Tensor, t: Tile, x: torch.Tensor = x,
                         gated: bool = gated) -> torch.Tensor:
                    return linear_triton(x, w, t, gated=gated)

                def theirs(w: torch.Tensor, x: torch.Tensor = x,
                           gated: bool = gated) -> torch.Tensor:
                    return silu_and_mul(F.linear(x, w)) if gated else F.linear(x, w)

                want = theirs(w)
                cublas = per_call_us(theirs, copies)
                best: tuple[float, Tile] | None = None
                for tile in tiles(m):
                    try:
                        got = ours(w, tile)
                    except triton.runtime.errors.OutOfResources:
                        continue
                    torch.testing.assert_close(got.float(), want.float(), rtol=2**-5,
                                               atol=5e-2)
                    us = per_call_us(lambda w, t=tile: ours(w, t), copies)
                    if best is None or us < best[0]:
                        best = (us, tile)
                assert best is not None
                label = name + (" +silu" if gated else "")
                t = best[1]
                row = {"shape": label, "n": n, "k": k, "m": m, "floor_us": floor_us,
                       "cublas_us": cublas, "triton_us": best[0],
                       "tile": [t.block_n, t.block_k, t.split_k, t.num_warps, t.num_stages]}
                rows.append(row)
                print(f"{label:16s} M={m:<3d} floor {floor_us:7.1f} us  cuBLAS {cublas:7.1f} "
                      f"({cublas / floor_us:4.2f}x)  triton {best[0]:7.1f} "
                      f"({best[0] / floor_us:4.2f}x) {row['tile']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"ceiling": ceiling.as_dict(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
