"""`openinfer bench latency`: one request at a time through an in-process engine stepped on
this thread, greedy and ignoring EOS so every request makes exactly `--output-len` tokens.

TTFT is add_request to the step that returns the first Token; TPOT is (E2E - TTFT) / (tokens
- 1); each is set beside the decode floor, the weights' bytes over the measured bandwidth."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

from openinfer_core.engine.engine import Engine
from openinfer_core.events import Error, Finished, Rejected, Scheduled, Token
from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest
from openinfer_server.bench import BenchError
from openinfer_server.bench.ceiling import measure_ceiling
from openinfer_server.bench.dataset import random_requests
from openinfer_server.bench.engine import (
    bench_engine_config,
    check_fits,
    load_engine,
    model_name,
    weight_bytes,
)
from openinfer_server.bench.report import latency_table, result_path, run_header, write_result
from openinfer_server.bench.stats import summarize_ms


@dataclass(frozen=True, slots=True)
class RequestTiming:
    ttft: float  # seconds
    e2e: float
    output_tokens: int
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied (from Scheduled)

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def time_request(engine: Engine, request: GenerateRequest) -> RequestTiming:
    """Run `request` alone to its end; the engine must be idle."""
    start = time.perf_counter()
    engine.add_request(request)
    first: float | None = None
    tokens = cached = 0
    while True:
        events = engine.step()
        now = time.perf_counter()
        for event in events:
            if event.request_id != request.request_id:
                continue
            if isinstance(event, Token):
                tokens += 1
                first = now if first is None else first
            elif isinstance(event, Scheduled):
                cached = event.cached_tokens
            elif isinstance(event, Finished):
                if first is None:
                    raise BenchError(f"request {request.request_id} finished without a token")
                return RequestTiming(first - start, now - start, tokens, cached)
            elif isinstance(event, Error | Rejected):
                raise BenchError(f"the engine failed request {request.request_id}: "
                                 f"{event.message}")
        if not engine.has_work():
            raise BenchError(f"the engine went idle before request {request.request_id} ended")


def drain(engine: Engine) -> None:
    # Finished requests give their KV back on the next step; do it outside the timed part.
    while engine.has_work():
        engine.step()


def measure_input_len(engine: Engine, input_len: int, output_len: int, *, iters: int,
                      warmup: int, seed: int) -> list[RequestTiming]:
    """Timings of `iters` requests after `warmup` unmeasured ones; every prompt is fresh, so
    no prefix-cache hit shortens a prefill."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    prompts = random_requests(warmup + iters, input_len, output_len,
                              vocab_size=engine.model.vocab_size, seed=seed + input_len)
    timings = []
    for i, prompt in enumerate(prompts):
        request = GenerateRequest(f"bench-latency-{input_len}-{i}", prompt.prompt_token_ids,
                                  params)
        timing = time_request(engine, request)
        drain(engine)
        if timing.output_tokens != output_len:
            raise BenchError(f"request {request.request_id} made {timing.output_tokens} "
                             f"tokens, not {output_len}")
        timings.append(timing)
    return timings[warmup:]


def summarize(timings: list[RequestTiming], input_len: int, output_len: int,
              floor_ms: float | None) -> dict[str, Any]:
    tpots = [t.tpot for t in timings if t.tpot is not None]
    run: dict[str, Any] = {"input_len": input_len, "output_len": output_len,
                           "num_iters": len(timings)}
    run |= summarize_ms("ttft", [t.ttft for t in timings])
    run |= summarize_ms("tpot", tpots)
    run |= summarize_ms("e2el", [t.e2e for t in timings])
    ratio = run["median_tpot_ms"] / floor_ms if tpots and floor_ms else None
    run["tpot_over_floor"] = ratio  # median TPOT / decode floor
    run["ttfts"] = [t.ttft for t in timings]
    run["e2els"] = [t.e2e for t in timings]
    return run


def run_latency(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    config = bench_engine_config(args, parser)
    ceiling = measure_ceiling(config.torch_device())
    engine = load_engine(args, config)
    for input_len in args.input_len:
        check_fits(engine, input_len, args.output_len)
    bytes_per_step = weight_bytes(engine)
    floor_ms = ceiling.floor_seconds(bytes_per_step) * 1e3 if bytes_per_step else None
    runs = []
    for input_len in args.input_len:
        timings = measure_input_len(engine, input_len, args.output_len, iters=args.num_iters,
                                    warmup=args.num_iters_warmup, seed=args.seed)
        runs.append(summarize(timings, input_len, args.output_len, floor_ms))
    model = model_name(args)
    result = {**run_header("latency", ceiling, model=model, command=args.argv),
              "weight_bytes": bytes_per_step, "decode_floor_ms": floor_ms, "runs": runs}
    print(latency_table(result))
    lens = "_".join(str(n) for n in args.input_len)
    write_result(result, result_path(args.result_file, args.result_dir,
                                     ["latency", model, f"in{lens}", f"out{args.output_len}"]))
    return 0
