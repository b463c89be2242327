"""The vocabulary projection two ways, Qwen3-4B shapes (V=151936, H=2560), bf16 weights: a bf16
GEMM then a conversion to fp32, against one GEMM writing fp32 (`torch.mm(out_dtype=float32)`,
what `openinfer_kernels.lm_head_logits` runs on CUDA). Usage: python lm_head_ab.py"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def main() -> None:
    w = torch.randn(151936, 2560, device="cuda", dtype=torch.bfloat16)
    for m in (1, 4, 16, 64, 256):
        x = torch.randn(m, 2560, device="cuda", dtype=torch.bfloat16)
        ways = {"bf16 then float": lambda x=x: F.linear(x, w).float(),
                "fp32 out": lambda x=x: torch.mm(x, w.t(), out_dtype=torch.float32)}
        for name, fn in ways.items():
            for _ in range(5):
                fn()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(50):
                fn()
            end.record()
            torch.cuda.synchronize()
            print(f"lm_head M={m} {name}: {start.elapsed_time(end) / 50 * 1e3:.1f} us")


if __name__ == "__main__":
    main()
