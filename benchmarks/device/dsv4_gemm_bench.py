"""DeepSeek-V4-Flash's quantized-weight GEMMs on CUDA against their floors: `fp8_block_linear` at
the FP8 projections' shapes for M = 1, 64, 2048 rows, and `fp4_moe_experts` (E=256, k=6, H=4096,
I=2048) at T = 1, 64, 2048 tokens. Each is timed two ways: one call's share of a CUDA graph of
calls on distinct weights (more bytes than L2 holds; the GPU's time, as the model's captured
decode steps see it) and the median CUDA-event time of single eager calls (the host's launch
cost included), printed beside its bytes floor (weights + scales + activations read, output
written, over the device-to-device copy bandwidth measured in the same run) and its FLOP floor
(989 TFLOP/s, H100 bf16 dense). Every result is checked against the reference first.

Usage: python benchmarks/device/dsv4_gemm_bench.py [--reps 50]"""

from __future__ import annotations

import argparse

import torch
from cuda_timing import copy_bandwidth, graph_per_call_us, median_us

from openinfer_deepseek_v4.kernels.moe import fp4_moe_experts_ref
from openinfer_deepseek_v4.kernels.moe.triton import fp4_moe_experts_triton
from openinfer_kernels.fp8_linear import fp8_block_linear_ref
from openinfer_kernels.fp8_linear.triton import fp8_block_linear_triton

PEAK_FLOPS = 989e12
FP8_SHAPES = {  # name: weight [N, K]
    "q_a": (1024, 4096), "q_b": (32768, 1024), "kv": (512, 4096), "o_a (8 groups)": (8192, 4096),
    "o_b": (4096, 8192), "shared gate_up": (4096, 4096), "shared down": (4096, 2048),
    "indexer q_b": (8192, 1024)}
HIDDEN, INTER, EXPERTS, TOP_K = 4096, 2048, 256, 6


L2_SPAN = 256 << 20  # bytes of distinct weights a timed graph cycles through


def row(name: str, us: float, eager_us: float, nbytes: float, flops: float,
        gbps: float) -> None:
    bytes_us, flop_us = nbytes / gbps / 1e3, flops / PEAK_FLOPS * 1e6
    floor = max(bytes_us, flop_us)
    print(f"{name:28s} {us:9.1f} {eager_us:9.1f} {bytes_us:9.1f} {flop_us:9.1f} "
          f"{us / floor:6.2f}x", flush=True)


def bench_fp8(gbps: float, reps: int) -> None:
    for m in (1, 64, 2048):
        for name, (n, k) in FP8_SHAPES.items():
            x = torch.randn((m, k), device="cuda", dtype=torch.bfloat16)
            copies = max(1, min(16, L2_SPAN // (n * k)))
            ws = [torch.randn((n, k), device="cuda").to(torch.float8_e4m3fn)
                  for _ in range(copies)]
            scale = torch.randint(118, 122, (-(-n // 128), -(-k // 128)), device="cuda",
                                  dtype=torch.uint8)
            w = ws[0]
            out = fp8_block_linear_triton(x, w, scale)
            torch.testing.assert_close(out.float(), fp8_block_linear_ref(x, w, scale).float(),
                                       rtol=2**-7, atol=0.05)
            eager = median_us(lambda x=x, w=w, s=scale: fp8_block_linear_triton(x, w, s), reps)
            us = graph_per_call_us([lambda x=x, w=c, s=scale: fp8_block_linear_triton(x, w, s)
                                    for c in ws])
            nbytes = w.numel() + scale.numel() + 2 * x.numel() + 2 * m * n
            row(f"fp8 {name} M={m}", us, eager, nbytes, 2 * m * n * k, gbps)
            del ws, w


def bench_moe(gbps: float, reps: int) -> None:
    byte = dict(device="cuda", dtype=torch.uint8)
    gate_up = torch.randint(0, 256, (EXPERTS, 2 * INTER, HIDDEN // 2), **byte)
    gate_up_scale = torch.randint(118, 122, (EXPERTS, 2 * INTER, HIDDEN // 32), **byte)
    down = torch.randint(0, 256, (EXPERTS, HIDDEN, INTER // 2), **byte)
    down_scale = torch.randint(118, 122, (EXPERTS, HIDDEN, INTER // 32), **byte)
    expert_bytes = (gate_up[0].numel() + gate_up_scale[0].numel() + down[0].numel()
                    + down_scale[0].numel())
    for t in (1, 64, 2048):
        x = torch.randn((t, HIDDEN), device="cuda", dtype=torch.bfloat16)
        ids = torch.rand((t, EXPERTS), device="cuda").topk(TOP_K, dim=-1).indices
        weights = torch.rand((t, TOP_K), device="cuda")
        args = (x, ids, weights, gate_up, gate_up_scale, down, down_scale, 10.0)
        out = fp4_moe_experts_triton(*args)
        if t <= 64:  # the reference loops over experts in Python: too slow at 2048
            want = fp4_moe_experts_ref(*args).float()
            torch.testing.assert_close(out.float(), want, rtol=2**-5,
                                       atol=2**-5 * want.abs().max().item())
        eager = median_us(lambda args=args: fp4_moe_experts_triton(*args), reps)
        # Different experts per call: rows of ids rolled (the weights, 3 GB, exceed L2).
        calls = [lambda a=(x, (ids + 37 * c) % EXPERTS, *args[2:]): fp4_moe_experts_triton(*a)
                 for c in range(4)]
        us = graph_per_call_us(calls)
        used = ids.unique().numel()
        nbytes = used * expert_bytes + 2 * x.numel() * 2
        flops = 2 * t * TOP_K * 3 * HIDDEN * INTER
        row(f"fp4 moe T={t} ({used} experts)", us, eager, nbytes, flops, gbps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    gbps = copy_bandwidth() / 1e9
    print(f"{torch.cuda.get_device_name()}: copy {gbps:.0f} GB/s, {PEAK_FLOPS / 1e12:.0f} "
          f"TFLOP/s bf16 dense")
    print(f"{'op':28s} {'graph us':>9s} {'eager us':>9s} {'bytes us':>9s} {'flop us':>9s} "
          f"{'/floor':>7s}")
    with torch.inference_mode():
        bench_fp8(gbps, args.reps)
        bench_moe(gbps, args.reps)


if __name__ == "__main__":
    main()
