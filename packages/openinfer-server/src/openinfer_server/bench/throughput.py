"""`openinfer bench throughput`: offline throughput, the way nano-vllm measures it. Every
request is submitted at once to an in-process engine, which is stepped until all have ended;
greedy and ignoring EOS, so each makes exactly its output length."""

from __future__ import annotations

import argparse
import time
from typing import Any

from openinfer_core.engine.engine import Engine
from openinfer_core.events import Error, Finished, Rejected, Token
from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest
from openinfer_server.bench import BenchError
from openinfer_server.bench.ceiling import measure_ceiling
from openinfer_server.bench.dataset import RandomRequest, random_requests
from openinfer_server.bench.engine import (
    bench_engine_config,
    check_fits,
    load_engine,
    model_name,
)
from openinfer_server.bench.report import result_path, run_header, throughput_table, write_result

WARMUP_OUTPUT_LEN = 4


def engine_requests(prompts: list[RandomRequest], prefix: str) -> list[GenerateRequest]:
    return [GenerateRequest(f"{prefix}-{i}", p.prompt_token_ids, SamplingParams(
                temperature=0.0, max_tokens=p.output_len, ignore_eos=True))
            for i, p in enumerate(prompts)]


def watch_compiles() -> list[str]:
    """Kernels Triton compiles (or loads from its disk cache) from now on, by name, in order:
    a step that waits on the JIT shows up in the step breakdown with what it compiled."""
    compiled: list[str] = []
    try:
        from triton import knobs
    except ImportError:  # no Triton, or one without knobs: nothing to watch
        return compiled

    def hook(*args: Any, **kwargs: Any) -> bool:
        compiled.append(str(kwargs.get("repr", "?")).split("(")[0])
        return False

    knobs.runtime.jit_post_compile_hook = hook
    return compiled


def run_batch(engine: Engine, requests: list[GenerateRequest],
              steps: list[tuple[float, int, list[str]]] | None = None,
              compiled: list[str] | None = None) -> tuple[float, int]:
    """Submit every request, step until all have ended: (seconds, output tokens). `steps`, if
    given, gets (seconds, tokens scheduled, kernels compiled) for every step."""
    pending = {r.request_id for r in requests}
    tokens = 0
    start = time.perf_counter()
    for request in requests:
        engine.add_request(request)
    while pending:
        began, known = time.perf_counter(), len(compiled or ())
        events = engine.step()
        if steps is not None:
            steps.append((time.perf_counter() - began, engine.last_step_tokens,
                          (compiled or [])[known:]))
        for event in events:
            if isinstance(event, Token):
                tokens += 1
            elif isinstance(event, Finished):
                pending.discard(event.request_id)
            elif isinstance(event, Error | Rejected):
                raise BenchError(f"the engine failed request {event.request_id}: "
                                 f"{event.message}")
        if pending and not engine.has_work():
            raise BenchError(f"the engine went idle with {len(pending)} requests unfinished")
    elapsed = time.perf_counter() - start
    while engine.has_work():  # the last frees land on one more step
        engine.step()
    return elapsed, tokens


def measure(engine: Engine, prompts: list[RandomRequest], warmup: RandomRequest,
            ) -> dict[str, Any]:
    # One short request first, so kernels compile and caches warm outside the timed part;
    # its prompt is its own, so no measured request gets a prefix-cache hit from it.
    run_batch(engine, engine_requests([warmup], "bench-warmup"))
    steps: list[tuple[float, int, list[str]]] = []
    elapsed, output_tokens = run_batch(engine, engine_requests(prompts, "bench-throughput"),
                                       steps, watch_compiles())
    expected = sum(p.output_len for p in prompts)
    if output_tokens != expected:
        raise BenchError(f"the engine made {output_tokens} tokens, not {expected}")
    input_tokens = sum(p.prompt_len for p in prompts)
    return {
        "num_requests": len(prompts), "elapsed_time": elapsed,
        "total_input_tokens": input_tokens, "total_output_tokens": output_tokens,
        "total_num_tokens": input_tokens + output_tokens,
        "requests_per_second": len(prompts) / elapsed,
        "output_tokens_per_second": output_tokens / elapsed,
        "tokens_per_second": (input_tokens + output_tokens) / elapsed,
        "step_breakdown": step_breakdown(steps),
        "num_preemptions": engine.snapshot().num_preemptions,
        "kv_capacity_tokens": engine.model_info.kv_capacity_tokens,
    }


def step_breakdown(steps: list[tuple[float, int, list[str]]]) -> dict[str, Any]:
    """Where the run's time went: steps of over 512 tokens (they carry prompt chunks and run
    eagerly) against the rest, and the slowest steps with the kernels compiled in them."""
    big = [(s, n) for s, n, _ in steps if n > 512]
    small = [(s, n) for s, n, _ in steps if n <= 512]
    slowest = sorted(steps, key=lambda step: -step[0])[:5]
    return {"steps": len(steps),
            "over_512_tokens": {"steps": len(big), "seconds": sum(s for s, _ in big),
                                "tokens": sum(n for _, n in big)},
            "up_to_512_tokens": {"steps": len(small), "seconds": sum(s for s, _ in small),
                                 "tokens": sum(n for _, n in small)},
            "slowest": [{"seconds": s, "tokens": n, "compiled": c} for s, n, c in slowest]}


def run_throughput(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    config = bench_engine_config(args, parser)
    ceiling = measure_ceiling(config.torch_device())
    engine = load_engine(args, config)
    prompts = random_requests(args.num_prompts, args.input_len, args.output_len,
                              vocab_size=engine.model.vocab_size,
                              range_ratio=args.random_range_ratio, seed=args.seed)
    [warmup] = random_requests(1, args.input_len, WARMUP_OUTPUT_LEN,
                               vocab_size=engine.model.vocab_size, seed=args.seed + 1_000_003)
    longest = max(prompts, key=lambda p: p.prompt_len + p.output_len)
    check_fits(engine, longest.prompt_len, longest.output_len)
    model = model_name(args)
    result = {**run_header("throughput", ceiling, model=model, command=args.argv),
              "input_len": args.input_len, "output_len": args.output_len,
              "random_range_ratio": args.random_range_ratio, **measure(engine, prompts, warmup)}
    print(throughput_table(result))
    write_result(result, result_path(
        args.result_file, args.result_dir,
        ["throughput", model, f"n{args.num_prompts}", f"in{args.input_len}",
         f"out{args.output_len}"]))
    return 0
