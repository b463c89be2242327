"""Where a batch-1 request's time to first token goes, cold and warm (prefix cached): wall time
of its steps, GPU kernel time by op and its top kernels (torch profiler), and the host
functions that take the most time (cProfile). A cold prompt over `max_num_batched_tokens`
takes one step per chunk.
Usage: python prefill_breakdown.py MODEL_DIR [--prompt-len N ...] [--json F]
(MODEL_DIR: a config folder; weights are made up with --load-format dummy)."""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import time
from collections import defaultdict
from typing import Any

import torch
from decode_breakdown import category, gpu_work
from step_timeline import Timers
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.events import Error, Finished, Rejected, Token
from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest


def until_token(engine: Engine, request_id: str) -> None:
    """Steps until `request_id` has its (only) token: one step, or one per prefill chunk. A
    request that ends without one (rejected, failed) raises rather than waiting forever."""
    while True:
        for event in engine.step():
            if event.request_id != request_id:
                continue
            if isinstance(event, Token):
                return
            if isinstance(event, Rejected | Error | Finished):
                raise RuntimeError(f"{request_id} ended without a token: {event}")


def first_token_step(engine: Engine, request_id: str, prompt: tuple[int, ...]) -> float:
    """Adds a one-token request; seconds from its first step to its token, then drains."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    engine.add_request(GenerateRequest(request_id, prompt, params))
    torch.cuda.synchronize()
    started = time.perf_counter()
    until_token(engine, request_id)
    took = time.perf_counter() - started
    while engine.has_work():
        engine.step()
    return took


def timeline(engine: Engine, request_id: str, prompt: tuple[int, ...]) -> dict[str, Any]:
    """One cold first-token step under the profiler, host and GPU on one clock: ms from the
    step's start to its first GPU work (`prelude`), of GPU idle between its first and last
    work (`idle`, the largest gaps with the kernel after each), and from its last GPU work to
    the token (`tail`). The host side runs slower under the profiler: an upper bound."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    engine.add_request(GenerateRequest(request_id, prompt, params))
    torch.cuda.synchronize()
    with (profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof,
          record_function("ttft-step")):
        until_token(engine, request_id)
    while engine.has_work():
        engine.step()
    events = prof.events()
    mark = next(e for e in events if e.name == "ttft-step" and e.device_type == DeviceType.CPU)
    t0, t1 = mark.time_range.start, mark.time_range.end
    work = [w for w in gpu_work(prof) if w[2] != "ttft-step" and t0 <= w[0] <= t1]
    gaps: list[tuple[float, str]] = []
    busy_end = work[0][1]
    for start, end, name in work[1:]:
        if start > busy_end:
            gaps.append((start - busy_end, name))
        busy_end = max(busy_end, end)
    gaps.sort(reverse=True)
    return {"step_ms": (t1 - t0) / 1e3, "prelude_ms": (work[0][0] - t0) / 1e3,
            "first_gpu_work": work[0][2], "idle_ms": sum(g for g, _ in gaps) / 1e3,
            "gaps_over_20us": sum(g > 20 for g, _ in gaps),
            "largest_gaps_us_before": [(round(g, 1), name[:60]) for g, name in gaps[:6]],
            "tail_ms": (t1 - busy_end) / 1e3}


def host_phases(engine: Engine, prompts: list[tuple[int, ...]]) -> dict[str, float]:
    """ms per first-token step (cold prompts, unprofiled) that the host spends in each part:
    scheduling, the host batch and its copy to the device, the forward's launches (FlashInfer's
    plan inside them, when it runs), sampling's launch, the wait for the token, the update;
    `ttft` is the whole, the rest of it is `other`."""
    from openinfer_core.engine import runner as runner_module
    from openinfer_core.interfaces.model import HostBatch

    attention = getattr(engine.model, "attention", None)  # DeepSeek-V4's is per layer
    targets = [(engine.scheduler, "schedule", "schedule"), (engine.scheduler, "update", "update"),
               (runner_module, "plan_batch", "plan_batch"),
               (HostBatch, "to_device", "to_device"),
               (engine.model, "forward", "forward_launch"),
               (engine.runner.sampler, "sample_async", "sample_launch"),
               (runner_module.Launched, "result", "wait")]
    if attention is not None and hasattr(attention, "_plan"):
        targets.append((attention, "_plan", "flashinfer_plan"))
    # Instance attributes are dropped after, class and module ones put back.
    saved = [(obj, name, obj.__dict__.get(name)) for obj, name, _ in targets]
    timers = Timers()
    for obj, name, label in targets:
        timers.wrap(obj, name, label)
    total = 0.0
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    try:
        for i, prompt in enumerate(prompts):
            engine.add_request(GenerateRequest(f"phases-{i}", prompt, params))
            torch.cuda.synchronize()
            started = time.perf_counter()
            until_token(engine, f"phases-{i}")
            total += time.perf_counter() - started
            counted = dict(timers.seconds)
            while engine.has_work():
                engine.step()
            timers.seconds.update(counted)  # the drain's steps are not the first token's
    finally:
        for obj, name, original in saved:
            if original is None:
                delattr(obj, name)
            else:
                setattr(obj, name, original)
    n = len(prompts)
    ms = {k: v / n * 1e3 for k, v in timers.seconds.items()}
    ms["ttft"] = total / n * 1e3
    ms["other"] = ms["ttft"] - sum(v for k, v in ms.items()
                                   if k not in ("ttft", "flashinfer_plan"))  # in the forward
    return ms


def breakdown(engine: Engine, prompt_len: int, warm: bool, iters: int) -> dict[str, Any]:
    rng = random.Random(prompt_len * 2 + warm)
    vocab = engine.model.vocab_size  # Qwen3's 151,936, DeepSeek-V4's 129,280
    print(f"progress: prompt {prompt_len} {'warm' if warm else 'cold'}", flush=True)
    prompts = [tuple(rng.randrange(100, vocab) for _ in range(prompt_len))
               for _ in range(3 * (iters + 2) + 4)]  # the last 4: timeline, host phases

    def run(i: int, tag: str) -> float:
        if warm:
            first_token_step(engine, f"{tag}-{i}-seed", prompts[i])
        return first_token_step(engine, f"{tag}-{i}", prompts[i])

    for i in range(2):
        run(i, "warmup")
    walls = [run(i, "timed") * 1e3 for i in range(2, iters + 2)]
    # GPU time of the measured step only: profile one step (a fresh prompt) at a time.
    by_cat: dict[str, float] = defaultdict(float)
    by_kernel: dict[str, float] = defaultdict(float)
    stats = io.StringIO()
    prof_host = cProfile.Profile()
    for i in range(2, iters + 2):
        prompt = prompts[iters + 2 + i]
        if warm:
            first_token_step(engine, f"prof-{i}-seed", prompt)
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        engine.add_request(GenerateRequest(f"prof-{i}", prompt, params))
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            until_token(engine, f"prof-{i}")
            torch.cuda.synchronize()
        for evt in prof.key_averages():
            dev_us = getattr(evt, "self_device_time_total", 0)
            if dev_us > 0:
                by_cat[category(evt.key)] += dev_us / iters / 1e3
                by_kernel[evt.key[:100]] += dev_us / iters / 1e3
        while engine.has_work():
            engine.step()
        # Host profile of the same kind of step, without the CUDA profiler in the way.
        prompt = prompts[2 * (iters + 2) + i]
        if warm:
            first_token_step(engine, f"host-{i}-seed", prompt)
        engine.add_request(GenerateRequest(f"host-{i}", prompt, params))
        torch.cuda.synchronize()
        prof_host.enable()
        until_token(engine, f"host-{i}")
        prof_host.disable()
        while engine.has_work():
            engine.step()
    pstats.Stats(prof_host, stream=stats).sort_stats("tottime").print_stats(18)
    walls.sort()
    gpu_ms = sum(by_cat.values())
    steps = timeline(engine, "timeline", prompts[-4]) if not warm else None
    phases = host_phases(engine, prompts[-3:]) if not warm else None
    return {"prompt_len": prompt_len, "warm": warm, "ttft_ms_p50": walls[len(walls) // 2],
            "ttft_ms_min": walls[0], "ttft_ms_max": walls[-1], "gpu_busy_ms": gpu_ms,
            "by_op_ms": dict(sorted(by_cat.items(), key=lambda kv: -kv[1])),
            "top_kernels_ms": dict(sorted(by_kernel.items(), key=lambda kv: -kv[1])[:15]),
            "host_top": stats.getvalue().splitlines()[-26:], "timeline": steps,
            "host_phases_ms": phases}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt-len", type=int, nargs="+", default=[256, 4096, 16384])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--json", help="write the breakdown here")
    ap.add_argument("--tensor-parallel-size", type=int, default=1,
                    help="the profile is rank 0's, its collectives a category of their own")
    ap.add_argument("--max-model-len", type=int,
                    help="default: the longest prompt + 1024, at least 17,408")
    ap.add_argument("--cold-only", action="store_true",
                    help="skip the warm (prefix-cached) pass")
    args = ap.parse_args()
    engine = Engine(EngineConfig(model=args.model, load_format="dummy",
                                 max_model_len=args.max_model_len
                                 or max(17408, max(args.prompt_len) + 1024),
                                 max_num_seqs=4,
                                 tensor_parallel_size=args.tensor_parallel_size))
    print("progress: engine ready", flush=True)
    reports = []
    for n in args.prompt_len:
        for warm in (False,) if args.cold_only else (False, True):
            r = breakdown(engine, n, warm, args.iters)
            reports.append(r)
            print(f"prompt {n} {'warm' if warm else 'cold'}: TTFT p50 {r['ttft_ms_p50']:.2f} ms "
                  f"(min {r['ttft_ms_min']:.2f}, max {r['ttft_ms_max']:.2f}), GPU busy "
                  f"{r['gpu_busy_ms']:.2f} ms: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in r["by_op_ms"].items()))
            for name, ms in r["top_kernels_ms"].items():
                print(f"  {ms:8.3f} ms  {name}")
            print("\n".join(r["host_top"]))
            if r["timeline"] is not None:
                print("timeline:", json.dumps(r["timeline"]))
                print("host phases:", json.dumps({k: round(v, 3)
                                                  for k, v in r["host_phases_ms"].items()}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports, f, indent=2)


if __name__ == "__main__":
    main()
