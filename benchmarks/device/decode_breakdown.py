"""Where a batch-1 decode step's time goes: GPU kernel time by op (torch profiler over CUDA-graph
replays), against the weight-read floor. Usage: python decode_breakdown.py MODEL_DIR [--steps N]
[--tensor-parallel-size N] (MODEL_DIR: a config folder; weights are made up with --load-format
dummy). Under tensor parallelism the profile is rank 0's, its collectives a category of their
own."""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest

CATEGORIES = [  # first match wins
    ("collective", r"nccl|all_reduce|allreduce|one_shot|two_shot|broadcast|all_gather"),
    ("linear_attn", r"gdn|conv_decode|delta_rule|gated_norm"),
    # DeepSeek-V4: routed / shared experts and routing, the hyper-connections (mHC), the
    # compressors and the indexer
    ("moe", r"gate_up_kernel|_down_kernel|expert|router|swiglu|route"),
    ("mhc", r"_mix_kernel|_weights_kernel|_expand_kernel|hc_"),
    ("compress_index", r"_pool_kernel|compress|indexer|_piece_kernel|quant_sim|round_rows"),
    ("fp8_quant", r"group_quant"),  # W8A8's per-token-group activation quantization
    ("attention", r"attn|attention|split_kernel|merge_kernel|prefill_kernel|flash"),
    ("gemm", r"gemm|nvjet|cutlass|sm90|xmma|cublas|splitk|gemv|linear_kernel|sum_splits"),
    ("norm", r"rms|norm"),
    ("rope", r"rope|rotary"),
    ("silu_mul", r"silu|act"),
    ("kv_append", r"kv_append|store|reshape_and_cache"),
    ("sampling", r"argmax|race|sample|softmax|topk|sort|max"),
    ("embedding", r"embed|index_select|gather"),
]


def category(name: str) -> str:
    low = name.lower()
    return next((c for c, pat in CATEGORIES if re.search(pat, low)), "other")


def gpu_work(prof: profile) -> list[tuple[float, float, str]]:
    """(start, end, name) of every piece of GPU work the profiler saw (kernels, copies,
    memsets), in µs on the profiler's clock, by start."""
    return sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                  if e.device_type == DeviceType.CUDA)


def marginal_ms(prof: profile, steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """ms per step that each op adds to the GPU's timeline: a kernel's end minus the latest end
    before it (0 when it ends earlier). Under PDL kernels overlap and their own durations
    include the wait for the one before; these marginal times add up to the steps' GPU time,
    so they show what each op costs the step. By category, and the top kernels by name."""
    work = gpu_work(prof)
    by_cat: dict[str, float] = defaultdict(float)
    by_kernel: dict[str, float] = defaultdict(float)
    latest = work[0][0] if work else 0.0
    for _, end, name in work:
        added = max(0.0, end - latest)
        latest = max(latest, end)
        by_cat[category(name)] += added / steps / 1e3
        by_kernel[name[:80]] += added / steps / 1e3
    return (dict(sorted(by_cat.items(), key=lambda kv: -kv[1])),
            dict(sorted(by_kernel.items(), key=lambda kv: -kv[1])[:24]))


def graph_replay_ms(engine: Engine, steps: int) -> float | None:
    """ms per replay of the smallest decode graph alone, back to back (the step's inputs as
    the last step left them: it rewrites that step's KV slot with the same values). Against
    `step_ms`, what the engine's host side adds to a step."""
    graphs = engine.graphs._graphs if engine.graphs is not None else {}
    if not graphs:
        return None
    graph = graphs[min(graphs)]
    graph.replay()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--json", help="write the breakdown here")
    args = ap.parse_args()
    engine = Engine(EngineConfig(model=args.model, load_format="dummy", max_model_len=4096,
                                 max_num_seqs=8, enforce_eager=args.eager,
                                 num_kv_blocks=1024,
                                 tensor_parallel_size=args.tensor_parallel_size))
    params = SamplingParams(temperature=0.0, max_tokens=args.steps * 3 + 20, ignore_eos=True)
    engine.add_request(GenerateRequest("probe", tuple(range(1000, 1000 + args.prompt_len)),
                                       params))
    for _ in range(10):
        engine.step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    step_ms = (time.perf_counter() - started) / args.steps * 1e3
    # A graph replayed alone would wait forever for the other ranks' collectives.
    replay_ms = graph_replay_ms(engine, args.steps) if args.tensor_parallel_size == 1 else None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
    by_cat: dict[str, float] = defaultdict(float)
    by_kernel: dict[str, float] = defaultdict(float)
    for evt in prof.key_averages():
        dev_us = getattr(evt, "self_device_time_total", None)
        if dev_us is None:
            dev_us = evt.self_cuda_time_total
        if dev_us <= 0:
            continue
        by_cat[category(evt.key)] += dev_us / args.steps / 1e3
        by_kernel[evt.key] += dev_us / args.steps / 1e3
    gpu_ms = sum(by_cat.values())
    launches = sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA) / args.steps
    marginal_by_op, marginal_by_kernel = marginal_ms(prof, args.steps)
    weight_bytes = getattr(engine.model, "weight_bytes", 0)
    report = {"step_ms": step_ms, "graph_replay_ms": replay_ms,
              "gpu_busy_ms": gpu_ms, "host_gap_ms": step_ms - gpu_ms,
              "gpu_work_items_per_step": launches,
              "weight_bytes": weight_bytes, "by_op_ms": dict(sorted(by_cat.items(),
                                                                     key=lambda kv: -kv[1])),
              "top_kernels_ms": dict(sorted(by_kernel.items(), key=lambda kv: -kv[1])[:12]),
              "marginal_by_op_ms": marginal_by_op, "marginal_top_kernels_ms": marginal_by_kernel,
              "eager": args.eager, "tensor_parallel_size": args.tensor_parallel_size}
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    engine.close()  # the tensor-parallel workers


if __name__ == "__main__":
    main()
