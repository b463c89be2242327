"""DeepSeek-V4-Flash's FP4 routed experts (E=256, k=6, H=4096, I=2048, bf16) at decode sizes:
the grouped path (routing sort, two grouped GEMMs, the top-k sum) against the decode path
(`moe/decode.py`: a matrix-vector product per (token, expert) pair, no routing step) at its
table's tile (`decode_tile`) and a few candidate tiles, at T = 1, 4, 16, 64 tokens. Each figure
is one call's share of a CUDA graph of calls that each route to other experts (ids rolled by
37; at one token a call reads 80 MB, more than the 50 MB L2), against its floor: the picked
experts' FP4 weights and scales, read once, plus x and the output, over the copy bandwidth
measured in the same run. Every decode result is checked against the grouped path's, and the
grouped path against the reference up to 16 tokens. Last, a table of all, then the
`DECODE_TILES` rows and `DECODE_MAX_PAIRS` it suggests (decode wins up to that many pairs).

--tp N: the experts one rank of N holds when they are split by width (I / N: 1024 at TP2, 512
at TP4), the rows printed for `WIDTH_TILES` then.

Usage (on the GPU machine, from the repo root; about a minute, most of it compiling):
    python benchmarks/device/dsv4_moe_sweep.py [--tokens 1 4 16 64] [--copies 8] [--tp 1]
On CPU, the same flow at tiny shapes under the interpreter, T = 1, 4 by default (about a
minute; the times are the interpreter's, meaningless):
    TRITON_INTERPRET=1 python benchmarks/device/dsv4_moe_sweep.py --dry-run"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

import torch
from cuda_timing import copy_bandwidth, graph_per_call_us

from openinfer_deepseek_v4.kernels.moe import fp4_moe_experts_ref
from openinfer_deepseek_v4.kernels.moe.decode import DecodeTile, decode_tile
from openinfer_deepseek_v4.kernels.moe.triton import DECODE_MAX_PAIRS, fp4_moe_experts_triton


class Shape(NamedTuple):
    hidden: int
    inter: int
    experts: int
    top_k: int


FLASH = Shape(4096, 2048, 256, 6)
TINY = Shape(64, 96, 8, 2)  # --dry-run
LIMIT = 10.0
# name: tile. gate_up programs = pairs * I / block_n, down = T * H / down_block_n * split *
# slot shares.
CANDIDATES = {
    "n16k512": DecodeTile(16, 512, 16, 512),
    "n16k512s2": DecodeTile(16, 512, 16, 512, down_split=2),
    "n32k512": DecodeTile(32, 512, 32, 512),
    "n8k1024s2": DecodeTile(8, 1024, 8, 1024, down_split=2),
    "n16k256s4": DecodeTile(16, 256, 16, 256, down_split=4),
    "n64k256w8": DecodeTile(64, 256, 64, 256, num_warps=8),
    # for a rank's narrow experts (down's K = I / TP): down's K step no longer than that K
    "n8k1024d16k512": DecodeTile(8, 1024, 16, 512),
    "n8k1024d32k256": DecodeTile(8, 1024, 32, 256),
    "n16k512d32k512": DecodeTile(16, 512, 32, 512),
    # more programs at one token on a TP4 rank's width (gate_up: 6 pairs x 512 / block_n;
    # down: H / down_block_n x the slot shares, each walking fewer of the token's 6 slots)
    "n4k1024d16k512": DecodeTile(4, 1024, 16, 512),
    "n4k1024d16k512w2": DecodeTile(4, 1024, 16, 512, num_warps=2),
    "n8k1024d16k512o2": DecodeTile(8, 1024, 16, 512, down_slot_split=2),
    "n8k1024d16k512o3": DecodeTile(8, 1024, 16, 512, down_slot_split=3),
    "n8k1024d8k512o3": DecodeTile(8, 1024, 8, 512, down_slot_split=3),
    "n4k1024d16k512o3": DecodeTile(4, 1024, 16, 512, down_slot_split=3),
}
Timer = Callable[[Sequence[Callable[[], object]]], float]


def wall_us(calls: Sequence[Callable[[], object]]) -> float:
    """--dry-run's stand-in for `graph_per_call_us`: wall-clock microseconds a call."""
    start = time.perf_counter()
    for call in calls:
        call()
    return (time.perf_counter() - start) * 1e6 / len(calls)


def make_experts(shape: Shape, device: str) -> tuple[torch.Tensor, ...]:
    """Random codes; scale bytes 2^-9 .. 2^-6 keep V4-Flash's outputs of order 1."""
    e, h, i = shape.experts, shape.hidden, shape.inter

    def byte(low: int, high: int, *size: int) -> torch.Tensor:
        return torch.randint(low, high, size, device=device, dtype=torch.uint8)

    return (byte(0, 256, e, 2 * i, h // 2), byte(118, 122, e, 2 * i, h // 32),
            byte(0, 256, e, h, i // 2), byte(118, 122, e, h, i // 32))


def sweep_tokens(t: int, shape: Shape, experts: tuple[torch.Tensor, ...], gbps: float,
                 copies: int, timer: Timer) -> dict[str, float]:
    """{"floor": us, "grouped": us, "table": us, candidate name: us} at t tokens."""
    device = experts[0].device
    x = torch.randn((t, shape.hidden), device=device, dtype=torch.bfloat16)
    ids = torch.rand((t, shape.experts), device=device).topk(shape.top_k, dim=-1).indices
    route_w = torch.rand((t, shape.top_k), device=device)
    grouped = fp4_moe_experts_triton(x, ids, route_w, *experts, LIMIT, path="grouped").float()
    if t <= 16:  # the reference dequantizes every picked expert to bf16 (50 MB each)
        want = fp4_moe_experts_ref(x, ids, route_w, *experts, LIMIT).float()
        torch.testing.assert_close(grouped, want, rtol=2**-5, atol=2**-5 * want.abs().max())
    picked = ids.unique().numel()
    expert_bytes = sum(w[0].numel() for w in experts)
    floor = (picked * expert_bytes + 2 * 2 * x.numel()) / gbps / 1e3
    rolled = [(ids + 37 * c) % shape.experts for c in range(copies)]

    def timed(**kw: object) -> float:
        return timer([partial(fp4_moe_experts_triton, x, r, route_w, *experts, LIMIT, **kw)
                      for r in rolled])

    result = {"floor": floor, "grouped": timed(path="grouped")}
    print(f"T={t} ({t * shape.top_k} pairs, {picked} experts): floor {floor:.1f} us, "
          f"grouped {result['grouped']:.1f} us ({result['grouped'] / floor:.2f}x)", flush=True)
    for name, tile in {"table": decode_tile(t, shape.inter), **CANDIDATES}.items():
        out = fp4_moe_experts_triton(x, ids, route_w, *experts, LIMIT, path="decode",
                                     tile=tile).float()
        torch.testing.assert_close(out, grouped, rtol=2**-6, atol=2**-6 * grouped.abs().max())
        result[name] = timed(path="decode", tile=tile)
        print(f"  {name:10s} {result[name]:8.1f} us ({result[name] / floor:5.2f}x)  {tile}",
              flush=True)
    return result


def report(results: dict[int, dict[str, float]], top_k: int, table: str) -> None:
    names = ["grouped", "table", *CANDIDATES]
    print(f"\n{'T':>3s} {'floor us':>8s} " + " ".join(f"{n:>14s}" for n in names)
          + "  best decode tile")
    best_rows = []
    for t, r in results.items():
        best = min(CANDIDATES, key=lambda n: r[n])
        cells = " ".join(f"{r[n]:8.1f} {r[n] / r['floor']:4.1f}x" for n in names)
        print(f"{t:3d} {r['floor']:8.1f} {cells}  {best}")
        best_rows.append((t, best, min(r["table"], r[best]) < r["grouped"]))
    print(f"\n{table} rows (most tokens, tile), best per T:")
    for t, best, _ in best_rows:
        print(f"    ({t}, {CANDIDATES[best]!r}),")
    wins = [t * top_k for t, _, win in best_rows if win]
    print(f"DECODE_MAX_PAIRS now {DECODE_MAX_PAIRS}; decode faster than grouped at pairs {wins}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", help="default 1 4 16 64 (dry run: 1 4)")
    p.add_argument("--copies", type=int, default=8, help="calls (expert sets) per graph")
    p.add_argument("--tp", type=int, default=1,
                   help="the experts of one rank of N, split by width (I / N)")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes on CPU under TRITON_INTERPRET=1: checks the flow only")
    args = p.parse_args()
    if args.dry_run and args.tp > 1:
        p.error("--tp narrows V4-Flash's experts: the dry run's tiny shapes take none")
    if args.dry_run:
        if os.environ.get("TRITON_INTERPRET") != "1":
            p.error("--dry-run runs the kernels under the interpreter: set TRITON_INTERPRET=1")
        shape, device, gbps, copies, timer = TINY, "cpu", 1.0, 1, wall_us
        print("dry run: tiny shapes on CPU, wall-clock times (not GPU times)")
    else:
        shape, device, copies, timer = FLASH, "cuda", args.copies, graph_per_call_us
        if args.tp > 1:
            shape = shape._replace(inter=shape.inter // args.tp)
            print(f"one rank of TP{args.tp}: experts {shape.inter} wide")
        gbps = copy_bandwidth() / 1e9
        print(f"{torch.cuda.get_device_name()}: copy {gbps:.0f} GB/s", flush=True)
    torch.manual_seed(0)
    with torch.inference_mode():
        experts = make_experts(shape, device)
        tokens = args.tokens or ([1, 4] if args.dry_run else [1, 4, 16, 64])
        results = {t: sweep_tokens(t, shape, experts, gbps, copies, timer) for t in tokens}
    report(results, shape.top_k,
           "DECODE_TILES" if args.tp == 1 else f"WIDTH_TILES[{shape.inter}]")


if __name__ == "__main__":
    main()
