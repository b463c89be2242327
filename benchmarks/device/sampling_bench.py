"""What sampling costs per step on the GPU, by batch size and sampling parameters: the engine's
`Sampler` with openinfer-kernels' `SAMPLING_KERNELS` (OPENINFER_SAMPLING picks them), and
FlashInfer's own calls alone where flashinfer-python is installed. Logits are random fp32
rows of Qwen3's vocabulary.
Usage: python sampling_bench.py [--batches 1 64 256 512] [--json FILE]"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from openinfer_core.params import SamplingParams
from openinfer_core.sampling.sampler import Sampler, SamplingRow
from openinfer_kernels.sampling import SAMPLING_KERNELS

VOCAB = 151936
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MODES = {  # name: SamplingParams keywords (Qwen3's generation_config.json is "qwen3-default")
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.7),
    "qwen3-default": dict(temperature=0.6, top_k=20, top_p=0.95),
    "top-p 0.9": dict(temperature=1.0, top_p=0.9),
    "top-k 50": dict(temperature=1.0, top_k=50),
    "greedy + 5 logprobs": dict(temperature=0.0, logprobs=5),
}


def timed_ms(fn: Callable[[], object], iters: int) -> float:
    fn()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        fn()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / iters * 1e3


def measure(batch: int, sampler: Sampler, fi: Any, iters: int) -> dict[str, float]:
    """ms per step of each mode at `batch` rows."""
    logits = torch.randn(batch, VOCAB, device=DEVICE) * 4
    out = {}
    for name, kwargs in MODES.items():
        rows = [SamplingRow(SamplingParams(max_tokens=16, **kwargs), (1, 2, 3), (4,))
                for _ in range(batch)]
        out[name] = timed_ms(lambda rows=rows: sampler.sample(logits, rows), iters)
    if fi is not None and os.environ.get("OPENINFER_SAMPLING") != "flashinfer":
        k = torch.full((batch,), 20, dtype=torch.int32, device=DEVICE)
        p = torch.full((batch,), 0.95, device=DEVICE)
        out["flashinfer qwen3-default"] = timed_ms(
            lambda: fi.top_k_top_p_sampling_from_logits(logits / 0.6, k, p).cpu(), iters)
        out["flashinfer top-p 0.9"] = timed_ms(
            lambda: fi.top_p_sampling_from_probs(torch.softmax(logits, -1), 0.9).cpu(), iters)
    out["torch.topk 20 (reference point)"] = timed_ms(
        lambda: torch.topk(logits, 20, dim=-1).indices.cpu(), iters)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256, 512])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        import flashinfer.sampling as fi
    except ImportError:
        fi = None
    sampler = Sampler(VOCAB, seed=0, kernels=SAMPLING_KERNELS)
    report: dict[str, dict[str, float]] = {}
    for batch in args.batches:
        for name, ms in measure(batch, sampler, fi, args.iters).items():
            report.setdefault(name, {})[str(batch)] = ms
    width = max(len(m) for m in report)
    print(f"{'ms per step':<{width}}  " + "  ".join(f"B={b:>4}" for b in args.batches))
    for name, by_batch in report.items():
        print(f"{name:<{width}}  " + "  ".join(f"{by_batch[str(b)]:>6.2f}"
                                               for b in args.batches))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
