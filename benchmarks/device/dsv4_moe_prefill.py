"""DeepSeek-V4-Flash's routed FP4 experts on a prompt step: the grouped GEMMs (gate_up with its
SwiGLU, down, the sum over each token's experts) at candidate tiles (`GroupedTile`: token rows,
weight rows, warps, stages), against the bf16 matmul ceiling of the same run. Each token picks
6 of 256 experts at random (about T * 6 / 256 rows an expert); the width is a rank's share of
the intermediate size (2048 on one GPU, 1024 at TP2 with the experts split by width). Every
candidate's output is checked against the default tile's (the same bits, or how far apart).

Usage: python dsv4_moe_prefill.py [--tokens 2048 8192] [--widths 2048 1024] [--json F]"""

from __future__ import annotations

import argparse
import json

import torch
from cuda_timing import median_us

from openinfer_deepseek_v4.kernels.moe.triton import (
    GroupedTile,
    fp4_moe_experts_triton,
    grouped_tile,
)
from openinfer_server.bench.ceiling import measure_ceiling

HIDDEN, EXPERTS, TOP_K, LIMIT = 4096, 256, 6, 10.0
CANDIDATES = [GroupedTile(64, 128, 4, 3), GroupedTile(128, 64, 4, 3), GroupedTile(128, 64, 8, 3),
              GroupedTile(128, 128, 8, 3), GroupedTile(128, 128, 8, 2)]


def case(tokens: int, inter: int) -> dict[str, torch.Tensor]:
    g = torch.Generator("cuda").manual_seed(tokens + inter)
    byte = dict(generator=g, dtype=torch.uint8, device="cuda")
    return {"x": torch.randn((tokens, HIDDEN), generator=g, device="cuda").to(torch.bfloat16),
            "ids": torch.rand((tokens, EXPERTS), generator=g, device="cuda").argsort(-1)[
                :, :TOP_K].int(),
            "weights": torch.rand((tokens, TOP_K), generator=g, device="cuda"),
            "gate_up": torch.randint(0, 256, (EXPERTS, 2 * inter, HIDDEN // 2), **byte),
            "gate_up_scale": torch.randint(120, 126, (EXPERTS, 2 * inter, HIDDEN // 32), **byte),
            "down": torch.randint(0, 256, (EXPERTS, HIDDEN, inter // 2), **byte),
            "down_scale": torch.randint(120, 126, (EXPERTS, HIDDEN, inter // 32), **byte)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--widths", type=int, nargs="+", default=[2048, 1024])
    ap.add_argument("--json")
    args = ap.parse_args()
    peak = measure_ceiling(torch.device("cuda")).matmul_tflops
    print(f"bf16 matmul ceiling: {peak:.0f} TFLOP/s")
    rows = []
    for inter in args.widths:
        for tokens in args.tokens:
            c = case(tokens, inter)
            flop = 2 * tokens * TOP_K * 3 * HIDDEN * inter
            default = grouped_tile(tokens * TOP_K, EXPERTS, fp32=False)
            want = fp4_moe_experts_triton(**c, limit=LIMIT, path="grouped", grouped=default)
            for tile in [default, *(t for t in CANDIDATES if t != default)]:
                def run(tile: GroupedTile = tile, c: dict[str, torch.Tensor] = c) -> torch.Tensor:
                    return fp4_moe_experts_triton(**c, limit=LIMIT, path="grouped", grouped=tile)
                name = f"T={tokens:5d} I={inter}: tile m{tile.block_m} n{tile.block_n} " \
                    f"w{tile.warps} s{tile.stages}"
                try:
                    got = run()
                    us = median_us(run, reps=10, warmup=2)
                except Exception as exc:  # a tile past the registers or shared memory
                    print(f"{name}: failed: {type(exc).__name__}: {exc}"[:300], flush=True)
                    continue
                diff = (got.float() - want.float()).abs().max().item()
                tflops = flop / us / 1e6
                row = {"tokens": tokens, "inter": inter, "tile": [tile.block_m, tile.block_n,
                       tile.warps, tile.stages], "default": tile == default, "us": round(us, 1),
                       "tflops": round(tflops, 1), "of_peak": round(tflops / peak, 3),
                       "same_bits": bool(torch.equal(got, want)), "max_abs_diff": diff}
                rows.append(row)
                print(f"{name}{' (default)' if row['default'] else ''}: "
                      f"{us:9.1f} us {tflops:6.1f} TFLOP/s ({tflops / peak:.2f} of the "
                      f"ceiling), {'same bits' if row['same_bits'] else f'max |diff| {diff:.3g}'}",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"matmul_tflops": peak, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
