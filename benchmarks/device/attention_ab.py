"""Attention backends side by side at serving shapes (Qwen3-8B heads: 32 q / 8 kv, head_dim 128,
bf16, page 16): each backend's `attend` (K/V append included) on the same step, and the KV read
floor at the HBM bandwidth measured in the same run.

Cases: decode at batch 128 x 4096 and 1 x 4096, one prompt of 2048 and of 8192 tokens.
FlashInfer's plan (host-side, once per step for all layers) is timed apart from its per-layer
run. `ms` is the wall time per call of back-to-back calls (launch-bound for small cases);
`kernel_ms` is the device time of the kernels alone, what a step replayed from a CUDA graph pays.
Usage: python attention_ab.py [--backends triton flashinfer] [--json PATH]"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable

import torch
from decode_attention import time_ms

from openinfer_core.interfaces.model import ForwardBatch
from openinfer_core.plugins import PluginManager

HQ, HK, D, PAGE = 32, 8, 128, 16
CASES = {"decode-128x4096": (128, 4096, 1), "decode-1x4096": (1, 4096, 1),
         "prefill-2048": (1, 2048, 2048), "prefill-8192": (1, 8192, 8192)}


def step(batch: int, context: int, queries: int) -> tuple[ForwardBatch, tuple[torch.Tensor, ...]]:
    pages = -(-context // PAGE)
    num_blocks = batch * pages + 1
    k_cache = torch.randn(num_blocks, PAGE, HK, D, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tables = (torch.randperm(num_blocks - 1, device="cuda")[:batch * pages] + 1).view(batch, -1)
    pos = torch.arange(context - queries, context, device="cuda")
    slots = (tables[:, pos // PAGE] * PAGE + pos % PAGE).flatten()
    t = batch * queries
    fb = ForwardBatch(
        input_ids=torch.zeros(t, dtype=torch.int64, device="cuda"), positions=pos.repeat(batch),
        slot_mapping=slots, query_start_loc=torch.arange(
            0, t + 1, queries, dtype=torch.int32, device="cuda"),
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device="cuda"),
        block_tables=tables.int(), logits_indices=torch.arange(
            queries - 1, t, queries, device="cuda"),
        max_query_len=queries, max_seq_len=context)
    q = torch.randn(t, HQ, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(t, HK, D, device="cuda", dtype=torch.bfloat16)
    return fb, (q, k, torch.randn_like(k), k_cache, v_cache)


def kernel_ms(fn: Callable[[], object], reps: int = 10) -> float:
    """Device time of the kernels one call launches (the profiler's sum): what a CUDA graph
    replay of it costs, whatever the host's launch time."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / reps / 1e3


def read_bandwidth() -> float:
    """Bytes/s of a 2 GiB device copy (reads + writes), counted as the read floor's rate."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / (time_ms(lambda: b.copy_(a)) / 1e3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", nargs="+", default=["triton", "flashinfer"])
    ap.add_argument("--json")
    args = ap.parse_args()
    regs = PluginManager().registries
    bandwidth = read_bandwidth()
    rows = []
    for name, (batch, context, queries) in CASES.items():
        fb, (q, k, v, k_cache, v_cache) = step(batch, context, queries)
        kv_bytes = 2 * batch * context * HK * D * 2
        flops = 4 * batch * HQ * D * (queries * context - queries * (queries - 1) / 2)
        floor_ms = kv_bytes / bandwidth * 1e3
        for backend_name in args.backends:
            cls = regs.attention_backends.resolve(backend_name)
            # FlashInfer's kernels on every step, decode included (the backend's default runs
            # decode and short steps on the Triton kernels, from CUDA graphs).
            backend = cls(every_step=True) if backend_name == "flashinfer" else cls()
            run = functools.partial(backend.attend, q, k, v, k_cache, v_cache, fb, D**-0.5)
            out = run()  # compiles and, for flashinfer, plans this batch
            backend_ms = time_ms(run)
            kernels_ms = kernel_ms(run)
            plan_ms = None
            if hasattr(backend, "_plan"):
                t0 = time.perf_counter()
                for _ in range(10):
                    backend._plan(q, k_cache, fb, D**-0.5)
                plan_ms = (time.perf_counter() - t0) / 10 * 1e3
            rows.append({"case": name, "backend": backend_name, "ms": backend_ms,
                         "kernel_ms": kernels_ms,
                         "plan_ms": plan_ms, "kv_read_floor_ms": floor_ms,
                         "tflops": flops / kernels_ms / 1e9, "out_norm": float(out.float().norm())})
            print(f"{name:16s} {backend_name:10s} {backend_ms:8.3f} ms  kernels {kernels_ms:.3f} ms"
                  f"  floor {floor_ms:.3f} ms ({floor_ms / kernels_ms:5.1%})  "
                  f"{flops / kernels_ms / 1e9:6.1f} TFLOP/s"
                  + (f"  plan {plan_ms:.3f} ms (host)" if plan_ms is not None else ""))
        outs = [r["out_norm"] for r in rows if r["case"] == name]
        assert max(outs) - min(outs) <= 1e-2 * max(outs), f"backends disagree on {name}: {outs}"
        del k_cache, v_cache
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"read_bandwidth_tbps": bandwidth / 1e12, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
