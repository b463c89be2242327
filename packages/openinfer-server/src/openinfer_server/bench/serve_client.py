"""`openinfer bench serve`: the client side of `vllm bench serve`, against a running server.

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from openinfer_server.bench import BenchError
from openinfer_server.bench.dataset import (
    FALLBACK_VOCAB_SIZE,
    RandomRequest,
    random_requests,
    tokenizer_vocab_size,
)
from openinfer_server.bench.report import result_path, run_header, serve_table, write_result
from openinfer_server.bench.stats import summarize_ms

if TYPE_CHECKING:
    from openinfer_server.bench.ceiling import Ceiling

REQUEST_TIMEOUT_S = 6 * 3600  # vLLM's: a benchmark request is never cut short


@dataclass(slots=True)
class RequestOutcome:
    prompt_len: int
    success: bool = False
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
                       ) -> dict[str, Any]:
    return {"model": model, "prompt": list(request.prompt_token_ids),
            "max_tokens": request.output_len, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}


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
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    start = time.perf_counter()

    async def one(payload: dict[str, Any], offset: float) -> RequestOutcome:
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        if gate is None:
            return await send_request(client, url, payload)
        async with gate:
            return await send_request(client, url, payload)

    outcomes = await asyncio.gather(*(one(p, o) for p, o in zip(payloads, offsets, strict=True)))
    return list(outcomes), time.perf_counter() - start


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
                "errors": [o.error for o in outcomes]}
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


async def benchmark(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """(model, metrics) of one run: a warmup request, then the measured requests."""
    base_url = args.base_url.rstrip("/")
    url = f"{base_url}{args.endpoint}"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    vocab = tokenizer_vocab_size(args.tokenizer) if args.tokenizer else FALLBACK_VOCAB_SIZE
    requests = random_requests(args.num_prompts, args.random_input_len, args.random_output_len,
                               vocab_size=vocab, range_ratio=args.random_range_ratio,
                               seed=args.seed)
    # The warmup's prompt is its own, so request 0 gets no prefix-cache hit from it.
    warmup = random_requests(1, args.random_input_len, args.random_output_len,
                             vocab_size=vocab, seed=args.seed + 1_000_003)[0]
    limits = httpx.Limits(max_connections=args.max_concurrency, max_keepalive_connections=None)
    async with httpx.AsyncClient(headers=headers, timeout=REQUEST_TIMEOUT_S,
                                 limits=limits) as client:
        model = args.model or await served_model(client, base_url)
        print(f"warmup request to {url} (model {model})")
        outcome = await send_request(
            client, url, completion_payload(model, warmup, ignore_eos=args.ignore_eos))
        if not outcome.success:
            raise BenchError(f"the warmup request failed: {outcome.error}")
        rate = "inf" if math.isinf(args.request_rate) else f"{args.request_rate:g}"
        print(f"sending {len(requests)} requests, rate {rate}/s, max concurrency "
              f"{args.max_concurrency or 'unlimited'}")
        payloads = [completion_payload(model, r, ignore_eos=args.ignore_eos) for r in requests]
        outcomes, duration = await run_requests(
            client, url, payloads, rate=args.request_rate,
            max_concurrency=args.max_concurrency, seed=args.seed)
    return model, compute_metrics(outcomes, duration, args.metric_percentiles)


def _ceiling() -> Ceiling | None:
    from openinfer_server.bench.ceiling import local_ceiling

    return local_ceiling()


def run_serve(args: argparse.Namespace) -> int:
    ceiling = _ceiling()  # before any request, while the GPU is idle
    model, metrics = asyncio.run(benchmark(args))
    rate: float | str = "inf" if math.isinf(args.request_rate) else args.request_rate
    result = {**run_header("serve", ceiling, model=model, command=args.argv),
              "base_url": args.base_url, "endpoint": args.endpoint,
              "tokenizer_id": args.tokenizer, "num_prompts": args.num_prompts,
              "request_rate": rate, "burstiness": 1.0, "max_concurrency": args.max_concurrency,
              "random_input_len": args.random_input_len,
              "random_output_len": args.random_output_len,
              "random_range_ratio": args.random_range_ratio, "ignore_eos": args.ignore_eos,
              "seed": args.seed, **metrics}
    print(serve_table(result, args.metric_percentiles))
    errors = sorted({e for e in metrics["errors"] if e})
    for error in errors[:5]:
        print(f"failed request: {error}", file=sys.stderr)
    concurrency = f"concurrency{args.max_concurrency}" if args.max_concurrency else ""
    write_result(result, result_path(
        args.result_file, args.result_dir,
        [p for p in ["serve", model, f"{rate}qps", concurrency] if p]))
    return 0 if metrics["completed"] else 1
