"""The per-token elementwise kernels of a Qwen3 layer at prefill and decode sizes, against the
bytes each must move at the copy bandwidth of the same run: fused add + RMSNorm and q/k norm +
rotary + KV append (Qwen3-8B heads). Each time is one call's share of a CUDA graph of calls on
distinct inputs. Usage: python norm_bench.py [--tokens 1 16 2048 8192] [--json F]"""

from __future__ import annotations

import argparse
import json

import torch
from cuda_timing import copy_bandwidth, graph_per_call_us

from openinfer_kernels.norm import fused_add_rms_norm
from openinfer_kernels.rotary import qk_norm_rope_append

H, HQ, HK, D = 4096, 32, 8, 128  # Qwen3-8B
BLOCK = 16


def add_norm_case(t: int, copies: int) -> tuple[list, int]:
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    w = torch.randn(H, device=dev, dtype=bf16)
    xs = [(torch.randn(t, H, device=dev, dtype=bf16), torch.randn(t, H, device=dev, dtype=bf16))
          for _ in range(copies)]
    calls = [lambda x=x, r=r: fused_add_rms_norm(x, r, w, 1e-6) for x, r in xs]
    return calls, 4 * t * H * 2  # read x, residual; write normed, sum


def norm_rope_case(t: int, copies: int) -> tuple[list, int]:
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    qw, kw = torch.randn(D, device=dev, dtype=bf16), torch.randn(D, device=dev, dtype=bf16)
    blocks = (t + BLOCK - 1) // BLOCK
    cos_sin = torch.randn(t + 1, D, device=dev, dtype=torch.float32)
    positions = torch.arange(t, device=dev)
    slots = torch.arange(t, device=dev)
    calls = []
    for _ in range(copies):
        qkv = torch.randn(t, (HQ + 2 * HK) * D, device=dev, dtype=bf16)
        q, k, v = (part.view(t, -1, D) for part in qkv.split([HQ * D, HK * D, HK * D], -1))
        kc = torch.empty(blocks, BLOCK, HK, D, device=dev, dtype=bf16)
        vc = torch.empty_like(kc)
        calls.append(lambda q=q, k=k, v=v, kc=kc, vc=vc: qk_norm_rope_append(
            q, k, v, qw, kw, 1e-6, positions, cos_sin, kc, vc, slots))
    return calls, 2 * t * (HQ + 2 * HK) * D * 2  # read q, k, v; write q, k, v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 2048, 8192])
    ap.add_argument("--json")
    args = ap.parse_args()
    bw = copy_bandwidth()
    rows = []
    for name, case in (("fused_add_rms_norm", add_norm_case),
                       ("qk_norm_rope_append", norm_rope_case)):
        for t in args.tokens:
            copies = max(2, min(64, (512 << 20) // max(1, t * H * 8)))  # ~0.5 GB: not in L2
            calls, moved = case(t, copies)
            us = graph_per_call_us(calls)
            floor_us = moved / bw * 1e6
            rows.append({"kernel": name, "tokens": t, "us": us, "floor_us": floor_us})
            print(f"{name:22s} T={t:5d}  {us:9.1f} us  floor {floor_us:8.1f} us  "
                  f"{us / floor_us:5.2f}x")
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_bandwidth": bw, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
