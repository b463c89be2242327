"""`openinfer bench prefix`: what the prefix cache saves on time to first token. Each fresh
random prompt is sent once (cold: nothing cached), then, after it finished and its blocks went
back to the cache, sent again (warm: every full block but the last token's is reused), one
request at a time through an in-process engine, as in `bench latency`.

The engine's own count of reused tokens (`Scheduled.cached_tokens`) is recorded and checked: a
cold prompt must reuse nothing and a warm one at least `input_len - block_size` tokens (all its
full blocks, one token always being left to compute), so a figure that claims to be warm is."""

from __future__ import annotations

import argparse
from typing import Any

from openinfer_core.engine.engine import Engine
from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest
from openinfer_server.bench import BenchError
from openinfer_server.bench.ceiling import measure_ceiling
from openinfer_server.bench.dataset import random_requests
from openinfer_server.bench.engine import bench_engine_config, check_fits, load_engine, model_name
from openinfer_server.bench.latency import RequestTiming, drain, time_request
from openinfer_server.bench.report import prefix_table, result_path, run_header, write_result
from openinfer_server.bench.stats import mean, median, summarize_ms

Pair = tuple[RequestTiming, RequestTiming]  # (cold, warm)


def least_warm_hit(input_len: int, block_size: int, caching: bool) -> int:
    """Cached tokens a warm request must report: all its full blocks, short of the one token
    always computed; none without a prefix cache."""
    return max(0, input_len - block_size) if caching else 0


def measure_pairs(engine: Engine, input_len: int, output_len: int, *, iters: int, warmup: int,
                  seed: int) -> list[Pair]:
    """`iters` cold/warm pairs after `warmup` unmeasured ones; every pair has a fresh prompt."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    prompts = random_requests(warmup + iters, input_len, output_len,
                              vocab_size=engine.model.vocab_size, seed=seed + input_len)
    caching = engine.config.enable_prefix_caching
    least = least_warm_hit(input_len, engine.model_info.kv_block_size, caching)
    pairs = []
    for i, prompt in enumerate(prompts):
        pair = []
        for kind in ("cold", "warm"):
            request_id = f"bench-prefix-{input_len}-{i}-{kind}"
            timing = time_request(engine, GenerateRequest(request_id, prompt.prompt_token_ids,
                                                          params))
            drain(engine)  # the cold request's blocks reach the cache on this step
            if timing.output_tokens != output_len:
                raise BenchError(f"request {request_id} made {timing.output_tokens} tokens, "
                                 f"not {output_len}")
            pair.append(timing)
        cold, warm = pair
        if cold.cached_tokens != 0:
            raise BenchError(f"the cold request of prompt {i} ({input_len} tokens) reused "
                             f"{cold.cached_tokens} cached tokens; its prompt is not fresh")
        if warm.cached_tokens < least:
            raise BenchError(
                f"the warm request of prompt {i} ({input_len} tokens) reused only "
                f"{warm.cached_tokens} cached tokens, not the {least} expected; was its KV "
                "evicted? (raise --num-kv-blocks or --gpu-memory-utilization)")
        pairs.append((cold, warm))
    return pairs[warmup:]


def summarize(pairs: list[Pair], input_len: int, output_len: int) -> dict[str, Any]:
    cold = [c.ttft for c, _ in pairs]
    warm = [w.ttft for _, w in pairs]
    cached = [w.cached_tokens for _, w in pairs]
    run: dict[str, Any] = {"input_len": input_len, "output_len": output_len,
                           "num_iters": len(pairs)}
    run |= summarize_ms("cold_ttft", cold)
    run |= summarize_ms("warm_ttft", warm)
    run |= {"warm_speedup": median(cold) / median(warm),  # median cold / median warm TTFT
            "cached_fraction": mean(cached) / input_len,
            "min_warm_cached_tokens": min(cached),
            "cold_ttfts": cold, "warm_ttfts": warm, "warm_cached_tokens": cached}
    return run


def run_prefix(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    config = bench_engine_config(args, parser)
    ceiling = measure_ceiling(config.torch_device())
    engine = load_engine(args, config)
    for input_len in args.input_len:
        check_fits(engine, input_len, args.output_len)
    runs = []
    for input_len in args.input_len:
        pairs = measure_pairs(engine, input_len, args.output_len, iters=args.num_iters,
                              warmup=args.num_iters_warmup, seed=args.seed)
        runs.append(summarize(pairs, input_len, args.output_len))
    model = model_name(args)
    result = {**run_header("prefix", ceiling, model=model, command=args.argv),
              "block_size": engine.model_info.kv_block_size,
              "enable_prefix_caching": config.enable_prefix_caching,
              "max_num_batched_tokens": config.max_num_batched_tokens, "runs": runs}
    print(prefix_table(result))
    lens = "_".join(str(n) for n in args.input_len)
    write_result(result, result_path(args.result_file, args.result_dir,
                                     ["prefix", model, f"in{lens}", f"out{args.output_len}"]))
    return 0
