"""A prompt step's o_proj / down followed by the residual add + RMSNorm, two ways (Qwen3-8B
shapes): cuBLAS's product then the fused add + norm kernel (what runs now), against cuBLAS
adding the residual in its epilogue (`torch.addmm`, beta = 1) then a plain RMSNorm, which moves
one activation-sized pass fewer. Each time is one call's share of a CUDA graph of calls on
distinct inputs. Usage: python residual_gemm.py [--tokens 2048 8192] [--json F]"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from cuda_timing import graph_per_call_us

from openinfer_kernels.norm import fused_add_rms_norm, rms_norm

H = 4096  # Qwen3-8B
SHAPES = {"o_proj": (H, 4096), "down": (H, 12288)}  # (N, K)


def cases(t: int, k: int, copies: int) -> tuple[list, list]:
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    nw = torch.randn(H, device=dev, dtype=bf16)
    ins = [(torch.randn(t, k, device=dev, dtype=bf16) / k ** 0.5,
            torch.randn(H, k, device=dev, dtype=bf16),
            torch.randn(t, H, device=dev, dtype=bf16)) for _ in range(copies)]
    now = [lambda x=x, w=w, r=r: fused_add_rms_norm(F.linear(x, w), r, nw, 1e-6)
           for x, w, r in ins]
    epilogue = [lambda x=x, w=w, r=r: (lambda s: (rms_norm(s, nw, 1e-6), s))(
        torch.addmm(r, x, w.t())) for x, w, r in ins]
    return now, epilogue


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for t in args.tokens:
        for name, (_, k) in SHAPES.items():
            now, epilogue = cases(t, k, copies=3)
            a, b = now[0](), epilogue[0]()
            # The sums may differ by the product's rounding before the add (a bf16 ulp).
            diff = (a[1].float() - b[1].float()).abs().max().item()
            scale = a[1].float().abs().max().item()
            row = {"tokens": t, "op": name, "now_us": graph_per_call_us(now),
                   "epilogue_us": graph_per_call_us(epilogue), "sum_max_diff": diff,
                   "sum_max_abs": scale}
            rows.append(row)
            print(f"{name:7s} T={t:5d}  product + add_norm {row['now_us']:8.1f} us   "
                  f"addmm + norm {row['epilogue_us']:8.1f} us   sums differ by <= {diff:.3g} "
                  f"(of {scale:.3g})")
            del now, epilogue
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
