"""Qwen3-8B's FP8 linears at M = 1 .. 8192 rows: W8A8 vs weight-only vs bf16, against ceilings
(and, by name, DeepSeek-V4-Flash's as a TP2 / TP4 rank holds them).

The weights are e4m3 with float32 128 x 128 block scales (as Qwen3-8B-FP8 stores them), each
multiplied every way the engine can, beside the ceilings of the same run: read bandwidth and
bf16 matmul rate (openinfer bench's ceiling: a sum over 1 GiB, torch.matmul at 8192^3) and
the FP8 matmul rate (torch._scaled_mm at 8192^3, per-tensor scales, bf16 out). The sides:
  bf16         torch.nn.functional.linear over the weight dequantized to bf16 (the default load)
  weight-only  fp8_block_linear: bf16 activations, the weight dequantized in registers
  w8a8         fp8_group_quant + fp8_w8a8_linear (what fp8_dynamic_linear runs from
               W8A8_MIN_ROWS rows), and w8a8-gemm, the GEMM alone
  scaled-mm    fp8_group_quant + torch._scaled_mm with 1x128 / 128x128 block scales (cuBLASLt),
               where this torch and GPU take them
and, with --sweep, the W8A8 GEMM at each candidate tile (the heuristic's input). Each time is
one call's share of a CUDA graph of calls on distinct weights (more bytes than L2 holds);
every side is first checked against the reference. Printed: us, TFLOP/s and its fraction of
the FP8 peak, GB/s of the operands read against the read bandwidth; --json keeps the rows.

Usage: python benchmarks/device/fp8_gemm.py [--rows 1,16,64,...] [--shapes qkv,o,gate_up,down]
       [--sweep] [--decode-sweep] [--json F]
V4-Flash at TP4 decode: --rows 1,16 --decode-sweep --shapes v4-wq_a,v4-wkv,v4-wq_b/4,
       v4-wo_b/4,v4-shared-up/4,v4-shared-down/4 (the stacks: v4-of_x,v4-of_q/4)"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from cuda_timing import graph_per_call_us

from openinfer_kernels.fp8_linear import (
    dequant_fp8_blocks_ref,
    fp8_block_linear_ref,
    fp8_group_quant_ref,
    fp8_w8a8_linear_ref,
)
from openinfer_kernels.fp8_linear.dynamic import W8A8_MIN_ROWS
from openinfer_kernels.fp8_linear.triton import Fp8Tile, fp8_block_linear_triton
from openinfer_kernels.fp8_linear.w8a8_triton import (
    W8a8Tile,
    fp8_group_quant_triton,
    fp8_w8a8_linear_triton,
)

SHAPES = {  # Qwen3-8B, weight [N, K]: hidden 4096, 32 + 2 x 8 heads of 128, intermediate 12288
    "qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
# DeepSeek-V4-Flash's FP8 linears as a rank holds them (`--shapes v4-...`; not in the default
# run): wq_a and wkv whole; at TP2 / TP4 wq_b's rows (64 heads x 512 over q_lora 1024), wo_b's
# columns (8 groups x o_lora 1024) and the shared expert's width (2048: up as the plain
# product of its gate and up rows, down); and the stacks the model runs (shared_input.py):
# x's FP8 products (wq_a and wkv, the compressors' being bf16) and, in a CSA layer, the q
# lora's (wq_b's rows and the indexer's wq_b, 64 heads x 128, which every rank holds whole).
V4_SHAPES = {
    "v4-of_x": (1536, 4096), "v4-of_q/2": (24576, 1024), "v4-of_q/4": (16384, 1024),
    "v4-wq_a": (1024, 4096), "v4-wkv": (512, 4096),
    "v4-wq_b/2": (16384, 1024), "v4-wo_b/2": (4096, 4096), "v4-shared-up/2": (2048, 4096),
    "v4-shared-down/2": (4096, 1024),
    "v4-wq_b/4": (8192, 1024), "v4-wo_b/4": (4096, 2048), "v4-shared-up/4": (1024, 4096),
    "v4-shared-down/4": (4096, 512)}
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
SWEEP = [W8a8Tile(64, 64), W8a8Tile(64, 128, num_stages=4), W8a8Tile(128, 64, num_stages=4),
         W8a8Tile(128, 128, num_warps=4, num_stages=4), W8a8Tile(128, 128, num_warps=8),
         W8a8Tile(128, 128, num_warps=8, num_stages=4), W8a8Tile(128, 256, num_warps=8),
         W8a8Tile(256, 128, num_warps=8), W8a8Tile(128, 128, group_m=16, num_warps=8,
                                                   num_stages=4)]
# Weight-only tiles for decode sizes (--decode-sweep): one row on the CUDA cores, BLOCK_N
# weight rows a program, BLOCK_K bytes of each a step, K split in SPLIT_K shares; 2-16 rows
# on 16-row MMA tiles.
DECODE_SWEEP_1 = [Fp8Tile(1, bn, bk, split, warps) for bn in (8, 16, 32) for bk in (512, 1024)
                  for split in (1, 2, 4) for warps in (4, 8)]
DECODE_SWEEP_16 = [Fp8Tile(16, bn, 128, split, 4, stages) for bn in (32, 64, 128)
                   for split in (1, 2, 4) for stages in (3, 4)]
L2_SPAN = 256 << 20  # bytes of distinct FP8 weights a timed graph cycles through
CEILING_SIZE = 8192


@dataclass(frozen=True, slots=True)
class Row:
    shape: str
    m: int
    n: int
    k: int
    side: str
    us: float
    tflops: float
    of_fp8_peak: float
    gbps: float  # operands read (weights, scales, activations) and output written, per second
    of_read: float


def fp8_ceiling_tflops() -> float | None:
    """torch._scaled_mm at 8192^3, e4m3 operands with per-tensor scales, bf16 out: the FP8
    tensor-core rate cuBLASLt reaches here; None where this torch or GPU has no FP8 matmul."""
    a = torch.randn(CEILING_SIZE, CEILING_SIZE, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(CEILING_SIZE, CEILING_SIZE, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    try:
        us = graph_per_call_us([lambda: torch._scaled_mm(a, b, one, one,
                                                         out_dtype=torch.bfloat16)] * 10)
    except (RuntimeError, NotImplementedError) as error:
        print(f"no FP8 ceiling: torch._scaled_mm failed: {str(error).splitlines()[0]}")
        return None
    return 2 * CEILING_SIZE**3 / us / 1e6


def scaled_mm_block(xq: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor,
                    scale: torch.Tensor) -> torch.Tensor:
    """cuBLASLt's block-scaled FP8 GEMM through torch: A [M, K] with 1x128 scales (M-major, as
    fp8_group_quant stores them), B = w^T [K, N] with 128x128 scales [K/128, N/128]."""
    return torch._scaled_mm(xq, w.t(), x_scale, scale.t(), out_dtype=torch.bfloat16)


def check(name: str, got: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether `got` is the reference's product (bf16 rounding, FP8 MMA accumulation)."""
    err = (got.float() - want).abs().max().item()
    limit = 2e-2 * want.abs().max().item() + 1e-2
    if err > limit:
        print(f"  {name}: max error {err:.3g} > {limit:.3g}: left out")
    return err <= limit


Side = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (e4m3 w, bf16 w) -> [M, N]


def tile_name(t: Fp8Tile) -> str:
    return (f"wo-tile {t.block_m}x{t.block_n}x{t.block_k} k{t.split_k} w{t.num_warps} "
            f"s{t.num_stages}")


def sides(x: torch.Tensor, scale: torch.Tensor, sweep: bool,
          decode_sweep: bool = False) -> dict[str, Side]:
    """Each way to multiply x by a weight (e4m3 with `scale`, or dequantized to bf16)."""
    xq, x_scale = fp8_group_quant_triton(x)
    found: dict[str, Side] = {
        "bf16": lambda w, d: torch.nn.functional.linear(x, d),
        "weight-only": lambda w, d: fp8_block_linear_triton(x, w, scale),
        "w8a8": lambda w, d: fp8_w8a8_linear_triton(*fp8_group_quant_triton(x), w, scale),
        "w8a8-gemm": lambda w, d: fp8_w8a8_linear_triton(xq, x_scale, w, scale),
        "scaled-mm": lambda w, d: scaled_mm_block(*fp8_group_quant_triton(x), w, scale)}
    if sweep and x.shape[0] >= 16:
        for t in SWEEP:
            found[f"tile {t.block_m}x{t.block_n} w{t.num_warps} s{t.num_stages} g{t.group_m}"] = (
                lambda w, d, t=t: fp8_w8a8_linear_triton(xq, x_scale, w, scale, tile=t))
    if decode_sweep and x.shape[0] <= 16:
        for t in DECODE_SWEEP_1 if x.shape[0] == 1 else DECODE_SWEEP_16:
            found[tile_name(t)] = (
                lambda w, d, t=t: fp8_block_linear_triton(x, w, scale, tile=t))
    return found


def bench_shape(name: str, n: int, k: int, rows: list[int], sweep: bool, read_gbps: float,
                fp8_tflops: float | None, decode_sweep: bool = False) -> list[Row]:
    copies = max(2, min(8, L2_SPAN // (n * k)))
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    ws = [torch.randn((n, k), device="cuda", generator=gen).mul_(64).to(torch.float8_e4m3fn)
          for _ in range(copies)]
    scale = torch.rand((n // 128, k // 128), device="cuda", generator=gen) / 448 + 1e-4
    dense = [dequant_fp8_blocks_ref(w, scale) for w in ws]  # bf16 [N, K]
    out: list[Row] = []
    for m in rows:
        x = torch.randn((m, k), device="cuda", dtype=torch.bfloat16, generator=gen)
        want = fp8_block_linear_ref(x, ws[0], scale, torch.float32)
        want_q = fp8_w8a8_linear_ref(*fp8_group_quant_ref(x), ws[0], scale, torch.float32)
        for side, fn in sides(x, scale, sweep, decode_sweep).items():
            try:
                got = fn(ws[0], dense[0])
            except (RuntimeError, ValueError) as error:  # a torch or tile this GPU refuses
                print(f"  {name} M={m} {side}: {str(error).splitlines()[0][:100]}")
                continue
            quantized = side not in ("bf16", "weight-only") and not side.startswith("wo-")
            if not check(f"{name} M={m} {side}", got, want_q if quantized else want):
                continue
            us = graph_per_call_us([lambda w=w, d=d, fn=fn: fn(w, d)
                                    for w, d in zip(ws, dense, strict=True)])
            w_bytes = 2 * n * k if side == "bf16" else n * k + 4 * scale.numel()
            nbytes = w_bytes + 2 * m * k + 2 * m * n
            tflops = 2 * m * n * k / us / 1e6
            gbps = nbytes / us / 1e3
            r = Row(name, m, n, k, side, round(us, 2), round(tflops, 1),
                    round(tflops / fp8_tflops, 3) if fp8_tflops else float("nan"),
                    round(gbps, 1), round(gbps / read_gbps, 3))
            out.append(r)
            print(f"{name:8s} {m:5d} {side:28s} {r.us:9.1f} {r.tflops:8.1f} {r.of_fp8_peak:6.2f} "
                  f"{r.gbps:8.0f} {r.of_read:6.2f}", flush=True)
    return out


def crossings(rows: list[Row]) -> dict[str, int | None]:
    """Per shape, the fewest rows from which w8a8 (quantize + GEMM) beats weight-only at
    every larger M measured: where W8A8_MIN_ROWS belongs."""
    found: dict[str, int | None] = {}
    for shape in dict.fromkeys(r.shape for r in rows):
        times = {(r.m, r.side): r.us for r in rows if r.shape == shape}
        ms = sorted({m for m, _ in times})
        wins = [m for m in ms if times.get((m, "w8a8"), float("inf"))
                < times.get((m, "weight-only"), float("inf"))]
        found[shape] = next((m for m in ms if all(x in wins for x in ms if x >= m)), None)
    return found


def best_decode_tiles(rows: list[Row]) -> dict[str, str]:
    """Per shape and M, the fastest weight-only tile of --decode-sweep beside the heuristic's
    time: {"shape M": "tile: us (heuristic us)"}."""
    best: dict[tuple[str, int], Row] = {}
    heuristic: dict[tuple[str, int], float] = {}
    for r in rows:
        key = (r.shape, r.m)
        if r.side == "weight-only":
            heuristic[key] = r.us
        elif r.side.startswith("wo-") and (key not in best or r.us < best[key].us):
            best[key] = r
    return {f"{s} {m}": f"{r.side}: {r.us} us (heuristic {heuristic.get((s, m))} us)"
            for (s, m), r in best.items()}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=lambda s: [int(v) for v in s.split(",")], default=list(ROWS),
                   help="comma-separated M values (default: 1,2,4,...,8192)")
    p.add_argument("--shapes", type=lambda s: s.split(","), default=list(SHAPES),
                   help=f"comma-separated, of {','.join(SHAPES | V4_SHAPES)} (default: "
                   f"{','.join(SHAPES)})")
    p.add_argument("--sweep", action="store_true",
                   help="also time the W8A8 GEMM at each candidate tile (M >= 16)")
    p.add_argument("--decode-sweep", action="store_true",
                   help="also time the weight-only kernel at candidate tiles (M <= 16)")
    p.add_argument("--json", help="write the ceilings and rows here")
    args = p.parse_args(argv)
    unknown = [s for s in args.shapes if s not in SHAPES | V4_SHAPES]
    if unknown:
        p.error(f"unknown shapes {unknown}; choose from {', '.join(SHAPES | V4_SHAPES)}")
    return args


def main() -> None:
    args = parse()
    if not torch.cuda.is_available():
        sys.exit("fp8_gemm.py times CUDA kernels: it needs a GPU")
    from openinfer_server.bench.ceiling import measure_ceiling

    ceiling = measure_ceiling(torch.device("cuda"))
    fp8_tflops = fp8_ceiling_tflops()
    print(f"{ceiling.gpu}: read {ceiling.read_gbps:.0f} GB/s, bf16 matmul "
          f"{ceiling.matmul_tflops:.0f} TFLOP/s, FP8 matmul "
          f"{fp8_tflops or float('nan'):.0f} TFLOP/s; W8A8_MIN_ROWS {W8A8_MIN_ROWS}")
    print(f"{'shape':8s} {'M':>5s} {'side':28s} {'us':>9s} {'TFLOP/s':>8s} {'/fp8':>6s} "
          f"{'GB/s':>8s} {'/read':>6s}")
    rows: list[Row] = []
    with torch.inference_mode():
        for name in args.shapes:
            rows += bench_shape(name, *(SHAPES | V4_SHAPES)[name], args.rows, args.sweep,
                                ceiling.read_gbps, fp8_tflops, args.decode_sweep)
            torch.cuda.empty_cache()
    cross = crossings(rows)
    print("w8a8 beats weight-only from M =", cross)
    decode = best_decode_tiles(rows)
    for key, best in decode.items():
        print(f"best weight-only tile, {key}: {best}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ceiling": ceiling.as_dict(), "fp8_matmul_tflops": fp8_tflops,
                       "w8a8_min_rows": W8A8_MIN_ROWS, "crossings": cross,
                       "best_decode_tiles": decode,
                       "rows": [asdict(r) for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
