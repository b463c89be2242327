"""The prompt step's four products at Qwen3-8B shapes (qkv, o, gate_up, down; bf16, `F.linear`
as the model calls it) through each BLAS library torch can pick (`cublas`, the default, and
`cublaslt`), against the plain square bf16 matmul of the same machine: TFLOP/s and µs a call.
Usage: python prefill_gemm.py [--tokens 2048 8192] [--json PATH]"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from decode_attention import time_ms

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 4096, 32, 8, 128, 12288
SHAPES = {  # name: (in features, out features)
    "qkv": (HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM),
    "o": (HEADS * HEAD_DIM, HIDDEN),
    "gate_up": (HIDDEN, 2 * INTER),
    "down": (INTER, HIDDEN),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    square = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for library in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(library)
        ms = time_ms(lambda: square @ square, reps=20)
        rows.append({"library": library, "shape": "square 8192", "tokens": 8192,
                     "us": round(ms * 1e3, 1), "tflops": round(2 * 8192**3 / ms / 1e9, 1)})
        print(json.dumps(rows[-1]), flush=True)
        for tokens in args.tokens:
            for name, (k, n) in SHAPES.items():
                x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
                ms = time_ms(lambda x=x, w=w: F.linear(x, w), reps=50)
                rows.append({"library": library, "shape": name, "tokens": tokens,
                             "us": round(ms * 1e3, 1),
                             "tflops": round(2 * tokens * k * n / ms / 1e9, 1)})
                print(json.dumps(rows[-1]), flush=True)
    layer = {(r["library"], r["tokens"]): 0.0 for r in rows if r["shape"] in SHAPES}
    for r in rows:
        if r["shape"] in SHAPES:
            layer[(r["library"], r["tokens"])] += r["us"]
    for (library, tokens), us in sorted(layer.items()):
        print(f"{library:9} {tokens:5} tokens: a layer's four products {us:8.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
