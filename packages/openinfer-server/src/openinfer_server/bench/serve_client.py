"""`openinfer bench serve`: the client side of `vllm bench serve`, against a running server;
several `--request-rate` values run a sweep, one rate after another.

Random token-id prompts go to /v1/completions as streamed requests (greedy, usage included),
sent at Poisson arrival times or all at once, at most `--max-concurrency` in flight. Metrics
are vLLM's, computed the same way: TTFT is the first chunk with a choice, ITL the gaps between
such chunks, E2E latency ends at the last of them, TPOT is (E2E - TTFT) / (tokens - 1) per
request, and output tokens are counted from the usage chunk."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from openinfer_server.bench import BenchError
from openinfer_server.bench.client_pool import ClientPool, client_processes
from openinfer_server.bench.dataset import (
    FALLBACK_VOCAB_SIZE,
    RandomRequest,
    random_requests,
    tokenizer_vocab_size,
)
from openinfer_server.bench.report import (
    SWEEP_COLUMNS,
    result_path,
    run_header,
    serve_table,
    sweep_row,
    sweep_table,
    write_result,
)
from openinfer_server.bench.stats import summarize_ms

if TYPE_CHECKING:
    from openinfer_server.bench.ceiling import Ceiling

REQUEST_TIMEOUT_S = 6 * 3600  # vLLM's: a benchmark request is never cut short


@dataclass(slots=True)
class RequestOutcome:
    prompt_len: int
    success: bool = False
    start: float = 0.0  # seconds from the run's start to sending (past the concurrency gate)
    ttft: float = 0.0  # seconds
    latency: float = 0.0  # to the last chunk with a choice
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    error: str = ""


def arrival_offsets(n: int, rate: float, seed: int) -> list[float]:
    """When each request is sent, in seconds from the start: the first at once, then gaps
    drawn from an exponential of mean 1/rate (a Poisson process); all at once when rate is
    inf. The same seed gives the same times."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for _ in range(n):
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets


def completion_payload(model: str, request: RandomRequest, *, ignore_eos: bool,
                       sampling: dict[str, float] | None = None) -> dict[str, Any]:
    """A streamed completion of `request`; `sampling`: its sampling fields (default greedy)."""
    return {"model": model, "prompt": list(request.prompt_token_ids),
            "max_tokens": request.output_len, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos,
            **(sampling or {"temperature": 0.0})}


def sampling_fields(args: argparse.Namespace) -> dict[str, float]:
    """The sampling fields `bench serve` sends: temperature always, the others when given."""
    fields = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
              "min_p": args.min_p}
    return {k: v for k, v in fields.items() if v is not None}


async def send_request(client: httpx.AsyncClient, url: str,
                       payload: dict[str, Any]) -> RequestOutcome:
    """One streamed completion, timed as vLLM times it."""
    out = RequestOutcome(prompt_len=len(payload["prompt"]))
    start = last = time.perf_counter()
    first = True
    usage: dict[str, Any] | None = None
    try:
        async with client.stream("POST", url, json=payload) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                out.error = f"HTTP {response.status_code}: {body[:500]}"
                return out
            async for line in response.aiter_lines():
                data = line.removeprefix("data:").strip() if line.startswith("data:") else ""
                if not data or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    out.error = f"error in the stream: {chunk['error']}"
                    return out
                if chunk.get("choices"):
                    now = time.perf_counter()
                    if first:
                        out.ttft, first = now - start, False
                    else:
                        out.itl.append(now - last)
                    last = now
                elif chunk.get("usage"):
                    usage = chunk["usage"]
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    if first:
        out.error = "the stream ended without a token"
    elif usage is None:
        out.error = "no usage chunk (the server ignored stream_options.include_usage)"
    else:
        out.success, out.latency = True, last - start
        out.output_tokens = int(usage["completion_tokens"])
    return out


async def run_requests(client: httpx.AsyncClient, url: str,
                       payloads: Sequence[dict[str, Any]], *, rate: float,
                       max_concurrency: int | None, seed: int,
                       ) -> tuple[list[RequestOutcome], float]:
    """Send every payload on its arrival time, at most `max_concurrency` in flight (a request
    that arrives while the limit is reached waits for a slot); (outcomes, seconds)."""
    offsets = arrival_offsets(len(payloads), rate, seed)
    start = time.perf_counter()
    outcomes = await send_on_schedule(client, url, payloads, offsets, max_concurrency, start)
    return outcomes, time.perf_counter() - start


async def send_on_schedule(client: httpx.AsyncClient, url: str,
                           payloads: Sequence[dict[str, Any]], offsets: Sequence[float],
                           max_concurrency: int | None, start: float) -> list[RequestOutcome]:
    """Payload i goes out at `start + offsets[i]` (perf_counter seconds)."""
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def sent(payload: dict[str, Any]) -> RequestOutcome:
        sent_at = time.perf_counter() - start
        outcome = await send_request(client, url, payload)
        outcome.start = sent_at
        return outcome

    async def one(payload: dict[str, Any], offset: float) -> RequestOutcome:
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        if gate is None:
            return await sent(payload)
        async with gate:
            return await sent(payload)

    return list(await asyncio.gather(*(one(p, o) for p, o in zip(payloads, offsets,
                                                                   strict=True))))


def compute_metrics(outcomes: Sequence[RequestOutcome], duration: float,
                    percentiles: Sequence[float]) -> dict[str, Any]:
    """vLLM's result fields; failed requests count in `failed` and nowhere else."""
    ok = [o for o in outcomes if o.success]
    total_input = sum(o.prompt_len for o in ok)
    total_output = sum(o.output_tokens for o in ok)
    tpots = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1]
    metrics: dict[str, Any] = {
        "duration": duration, "completed": len(ok), "failed": len(outcomes) - len(ok),
        "total_input_tokens": total_input, "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration,
        "output_throughput": total_output / duration,
        "total_token_throughput": (total_input + total_output) / duration,
    }
    metrics |= summarize_ms("ttft", [o.ttft for o in ok], percentiles)
    metrics |= summarize_ms("tpot", tpots, percentiles)
    metrics |= summarize_ms("itl", [gap for o in ok for gap in o.itl], percentiles)
    metrics |= summarize_ms("e2el", [o.latency for o in ok], percentiles)
    metrics |= {"input_lens": [o.prompt_len for o in outcomes],
                "output_lens": [o.output_tokens for o in outcomes],
                "ttfts": [o.ttft for o in outcomes], "itls": [o.itl for o in outcomes],
                "errors": [o.error for o in outcomes],
                # Beyond vLLM's fields: when each request went out (seconds from the run's
                # start), and how many were in flight on average (their latencies over the run:
                # Little's law), which the ramp-up and drain keep under the concurrency limit.
                "start_times": [o.start for o in outcomes],
                "mean_in_flight": sum(o.latency for o in ok) / duration if duration > 0 else 0.0}
    return metrics


async def served_model(client: httpx.AsyncClient, base_url: str) -> str:
    """The first model of GET /v1/models."""
    try:
        response = await client.get(f"{base_url}/v1/models")
    except httpx.HTTPError as exc:
        raise BenchError(f"cannot reach the server at {base_url} ({exc}); start it with "
                         "`openinfer serve` or pass --base-url") from exc
    if response.status_code != 200:
        raise BenchError(f"GET {base_url}/v1/models answered {response.status_code}: "
                         f"{response.text[:300]}")
    models = response.json().get("data") or []
    if not models:
        raise BenchError(f"{base_url}/v1/models lists no model; pass --model")
    return str(models[0]["id"])


def sweep_plan(args: argparse.Namespace, parser: argparse.ArgumentParser,
               ) -> list[tuple[float, int]]:
    """(request rate, number of prompts) of each run: `--num-prompts` gives one count for every
    rate or one per rate."""
    rates, counts = args.request_rate, args.num_prompts
    if len(counts) == 1:
        counts = counts * len(rates)
    elif len(counts) != len(rates):
        parser.error(f"--num-prompts: give one count, or one per --request-rate value "
                     f"({len(rates)}), not {len(counts)}")
    return list(zip(rates, counts, strict=True))


def rate_value(rate: float) -> float | str:
    """A rate as the JSON spells it (vLLM's): a number, or "inf"."""
    return "inf" if math.isinf(rate) else rate


def _headers(args: argparse.Namespace) -> dict[str, str]:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def client_for(args: argparse.Namespace, max_connections: int | None) -> httpx.AsyncClient:
    return make_client(_headers(args), max_connections)


def make_client(headers: dict[str, str], max_connections: int | None) -> httpx.AsyncClient:
    # Idle connections are dropped before uvicorn's 5 s keep-alive ends: otherwise a request
    # may go out on a connection the server is closing (a ReadError that is nobody's failure).
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=None,
                          keepalive_expiry=2.0)
    return httpx.AsyncClient(headers=headers, timeout=REQUEST_TIMEOUT_S, limits=limits)


async def warm_up(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> None:
    outcome = await send_request(client, url, payload)
    if not outcome.success:
        raise BenchError(f"the warmup request failed: {outcome.error}")


async def benchmark(args: argparse.Namespace, plan: Sequence[tuple[float, int]],
                    percentiles: Sequence[float],
                    on_run: Callable[[str, dict[str, Any]], None]) -> str:
    """A warmup request, then one run per (rate, prompts) of `plan`, each handed to `on_run`
    with the model name as it ends; returns the model name. Run i draws its prompts and
    arrival times from seed + i, so no run gets prefix-cache hits from an earlier one."""
    workers = client_processes(args, max(n for _, n in plan))
    pool = ClientPool(workers, _headers(args)) if workers > 1 else None
    if pool is not None:
        print(f"{workers} client processes share the requests (--client-processes)")
    try:
        return await _benchmark(args, plan, percentiles, on_run, pool)
    finally:
        if pool is not None:
            pool.close()


async def _benchmark(args: argparse.Namespace, plan: Sequence[tuple[float, int]],
                     percentiles: Sequence[float],
                     on_run: Callable[[str, dict[str, Any]], None],
                     pool: ClientPool | None) -> str:
    base_url = args.base_url.rstrip("/")
    url = f"{base_url}{args.endpoint}"
    vocab = tokenizer_vocab_size(args.tokenizer) if args.tokenizer else FALLBACK_VOCAB_SIZE
    # The warmup's prompt is its own, so request 0 gets no prefix-cache hit from it.
    warmup = random_requests(1, args.random_input_len, args.random_output_len,
                             vocab_size=vocab, seed=args.seed + 1_000_003)[0]
    async with client_for(args, args.max_concurrency) as client:
        model = args.model or await served_model(client, base_url)
        print(f"warmup request to {url} (model {model})")
        sampling = sampling_fields(args)
        await warm_up(client, url, completion_payload(model, warmup, ignore_eos=args.ignore_eos,
                                                      sampling=sampling))
        for i, (rate, num_prompts) in enumerate(plan):
            seed = args.seed + i
            requests = random_requests(num_prompts, args.random_input_len,
                                       args.random_output_len, vocab_size=vocab,
                                       range_ratio=args.random_range_ratio, seed=seed)
            print(f"sending {num_prompts} requests, rate {rate:g}/s, max concurrency "
                  f"{args.max_concurrency or 'unlimited'}")
            payloads = [completion_payload(model, r, ignore_eos=args.ignore_eos,
                                           sampling=sampling)
                        for r in requests]
            if pool is None:
                outcomes, duration = await run_requests(
                    client, url, payloads, rate=rate, max_concurrency=args.max_concurrency,
                    seed=seed)
            else:
                outcomes, duration = await pool.run(
                    url, payloads, arrival_offsets(len(payloads), rate, seed),
                    args.max_concurrency)
            # The run's start on the wall clock (to the ms), to line its requests up with
            # what the server logged or sampled meanwhile.
            started_at = time.time() - duration
            on_run(model, {"num_prompts": num_prompts, "request_rate": rate_value(rate),
                           "seed": seed, "started_at_unix": started_at,
                           **compute_metrics(outcomes, duration, percentiles)})
    return model


def client_ceiling() -> Ceiling | None:
    """The ceilings of this machine's GPU, if any: a client runs beside the server."""
    from openinfer_server.bench.ceiling import local_ceiling

    return local_ceiling()


def _print_errors(runs: Sequence[dict[str, Any]]) -> None:
    errors = sorted({e for run in runs for e in run["errors"] if e})
    for error in errors[:5]:
        print(f"failed request: {error}", file=sys.stderr)


def run_serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """One rate gives vLLM's flat result; several give the shared fields once and `runs`, one
    entry per rate with the fields that differ (`request_rate`, `num_prompts`, `seed`, the
    metrics), rewritten after each rate so a sweep cut short keeps what it measured."""
    plan = sweep_plan(args, parser)
    sweep = len(plan) > 1
    # A sweep's table shows p50 and p99 whatever --metric-percentiles asks.
    percentiles = args.metric_percentiles
    if sweep and 99.0 not in percentiles:
        percentiles = (*percentiles, 99.0)
    ceiling = client_ceiling()  # before any request, while the GPU is idle
    common = {"base_url": args.base_url, "endpoint": args.endpoint,
              "tokenizer_id": args.tokenizer, "burstiness": 1.0,
              "max_concurrency": args.max_concurrency,
              "random_input_len": args.random_input_len,
              "random_output_len": args.random_output_len,
              "random_range_ratio": args.random_range_ratio, "ignore_eos": args.ignore_eos}
    rates = [rate_value(rate) for rate, _ in plan]
    runs: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    out: list[Path | None] = []  # the result path, named once the model is known

    def on_run(model: str, run: dict[str, Any]) -> None:
        nonlocal result
        if not out:
            concurrency = f"concurrency{args.max_concurrency}" if args.max_concurrency else ""
            rate_part = "_".join(str(r) for r in rates)
            out.append(result_path(args.result_file, args.result_dir, [
                p for p in ["serve", model, f"{rate_part}qps", concurrency] if p]))
            result = {**run_header("serve", ceiling, model=model, command=args.argv),
                      **common}
        runs.append(run)
        if not sweep:
            result |= run
            return
        result |= {"request_rates": rates, "runs": runs}
        if len(runs) == 1:
            print(" ".join(f"{name:>{width}}" for name, width in SWEEP_COLUMNS))
        print(sweep_row(run))
        write_result(result, out[0], quiet=True)

    asyncio.run(benchmark(args, plan, percentiles, on_run))
    print(sweep_table(result) if sweep else serve_table(result, percentiles))
    _print_errors(runs)
    write_result(result, out[0])
    return 0 if all(run["completed"] for run in runs) else 1
