"""`openinfer bench latency`: one request at a time (or `--batch-size` requests added together,
as vLLM's flag) through an in-process engine stepped on this thread, greedy and ignoring EOS so
every request makes exactly `--output-len` tokens.

TTFT is add_request to the step that returns the request's first Token; TPOT is (E2E - TTFT)
/ (tokens - 1), per request; each is set beside the decode floor, the batch-1 step's weight
bytes over the measured bandwidth (a larger batch of a mixture-of-experts model reads more)."""

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
    return time_batch(engine, [request])[0]


def time_batch(engine: Engine, requests: list[GenerateRequest]) -> list[RequestTiming]:
    """Add `requests` together and run them all to their ends; the engine must be idle. Their
    timings, in the order given."""
    start = time.perf_counter()
    for request in requests:
        engine.add_request(request)
    first: dict[str, float] = {}
    tokens = {request.request_id: 0 for request in requests}
    cached = dict.fromkeys(tokens, 0)
    done: dict[str, RequestTiming] = {}
    while len(done) < len(requests):
        events = engine.step()
        now = time.perf_counter()
        for event in events:
            rid = event.request_id
            if rid not in tokens or rid in done:
                continue
            if isinstance(event, Token):
                tokens[rid] += 1
                first.setdefault(rid, now)
            elif isinstance(event, Scheduled):
                cached[rid] = event.cached_tokens
            elif isinstance(event, Finished):
                if rid not in first:
                    raise BenchError(f"request {rid} finished without a token")
                done[rid] = RequestTiming(first[rid] - start, now - start, tokens[rid],
                                          cached[rid])
            elif isinstance(event, Error | Rejected):
                raise BenchError(f"the engine failed request {rid}: {event.message}")
        if len(done) < len(requests) and not engine.has_work():
            left = sorted(set(tokens) - set(done))
            raise BenchError(f"the engine went idle before requests {left[:4]} ended")
    return [done[request.request_id] for request in requests]


def drain(engine: Engine) -> None:
    # Finished requests give their KV back on the next step; do it outside the timed part.
    while engine.has_work():
        engine.step()


def measure_input_len(engine: Engine, input_len: int, output_len: int, *, iters: int,
                      warmup: int, seed: int, batch_size: int = 1) -> list[RequestTiming]:
    """Timings of `iters` batches of `batch_size` requests (each request's) after `warmup`
    unmeasured batches; every prompt is fresh, so no prefix-cache hit shortens a prefill."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    prompts = random_requests((warmup + iters) * batch_size, input_len, output_len,
                              vocab_size=engine.model.vocab_size, seed=seed + input_len)
    requests = [GenerateRequest(f"bench-latency-{input_len}-{i}", prompt.prompt_token_ids, params)
                for i, prompt in enumerate(prompts)]
    timings = []
    for i in range(warmup + iters):
        batch = requests[i * batch_size:(i + 1) * batch_size]
        batch_timings = time_batch(engine, batch)
        drain(engine)
        for request, timing in zip(batch, batch_timings, strict=True):
            if timing.output_tokens != output_len:
                raise BenchError(f"request {request.request_id} made {timing.output_tokens} "
                                 f"tokens, not {output_len}")
        if i >= warmup:
            timings += batch_timings
    return timings


def summarize(timings: list[RequestTiming], input_len: int, output_len: int,
              floor_ms: float | None, batch_size: int = 1) -> dict[str, Any]:
    tpots = [t.tpot for t in timings if t.tpot is not None]
    run: dict[str, Any] = {"input_len": input_len, "output_len": output_len,
                           "batch_size": batch_size, "num_iters": len(timings) // batch_size}
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
    if args.batch_size > config.max_num_seqs:
        parser.error(f"--batch-size {args.batch_size} is more than --max-num-seqs "
                     f"{config.max_num_seqs}: the batch would not run together; raise "
                     f"--max-num-seqs")
    ceiling = measure_ceiling(config.torch_device())
    engine = load_engine(args, config)
    for input_len in args.input_len:
        check_fits(engine, input_len, args.output_len)
    bytes_per_step = weight_bytes(engine)
    floor_ms = ceiling.floor_seconds(bytes_per_step) * 1e3 if bytes_per_step else None
    runs = []
    for input_len in args.input_len:
        timings = measure_input_len(engine, input_len, args.output_len, iters=args.num_iters,
                                    warmup=args.num_iters_warmup, seed=args.seed,
                                    batch_size=args.batch_size)
        runs.append(summarize(timings, input_len, args.output_len, floor_ms, args.batch_size))
    model = model_name(args)
    result = {**run_header("latency", ceiling, model=model, command=args.argv),
              "weight_bytes": bytes_per_step, "decode_floor_ms": floor_ms, "runs": runs}
    print(latency_table(result))
    lens = "_".join(str(n) for n in args.input_len)
    batch = [f"bs{args.batch_size}"] if args.batch_size > 1 else []
    write_result(result, result_path(args.result_file, args.result_dir,
                                     ["latency", model, f"in{lens}", f"out{args.output_len}",
                                      *batch]))
    return 0
