"""`openinfer bench interference`: how much long prompts arriving at a running server stall
the short requests it is already streaming, the cost chunked prefill exists to bound.

`--short-concurrency` workers each send one short streamed request after another (a closed
loop, EOS ignored) for `--duration` seconds, while long prompts arrive every `--long-interval`
seconds (or at Poisson times of that mean). Every prompt is fresh random token ids, so the
prefix cache saves nothing. Reported: the short requests' ITL (all gaps, and the gaps that
overlap a long prompt's prefill, from its send to its first token) and TPOT, the long prompts'
TTFT. Run it against servers started with different `--max-num-batched-tokens`."""

from __future__ import annotations

import argparse
import asyncio
import bisect
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from openinfer_server.bench import BenchError
from openinfer_server.bench.dataset import (
    FALLBACK_VOCAB_SIZE,
    RandomRequest,
    tokenizer_vocab_size,
)
from openinfer_server.bench.report import interference_table, result_path, run_header, write_result
from openinfer_server.bench.serve_client import (
    RequestOutcome,
    client_ceiling,
    client_for,
    completion_payload,
    send_request,
    served_model,
    warm_up,
)
from openinfer_server.bench.stats import summarize_ms


@dataclass(frozen=True, slots=True)
class Sent:
    """A request's outcome and when it was sent, in seconds from the start of the run."""

    at: float
    outcome: RequestOutcome


def long_offsets(duration: float, interval: float, poisson: bool, seed: int) -> list[float]:
    """Send times of the long prompts in [0, duration): every `interval` from `interval` on,
    or gaps drawn from an exponential of that mean."""
    rng = random.Random(seed)

    def gap() -> float:
        return rng.expovariate(1 / interval) if poisson else interval

    offsets, t = [], gap()
    while t < duration:
        offsets.append(t)
        t += gap()
    return offsets


def merged_windows(longs: Sequence[Sent]) -> list[tuple[float, float]]:
    """The spans during which some long prompt was prefilling (sent, not yet answered with a
    first token), merged where they overlap, in order."""
    spans = sorted((s.at, s.at + s.outcome.ttft) for s in longs if s.outcome.success)
    merged: list[tuple[float, float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def split_gaps(shorts: Sequence[Sent], windows: Sequence[tuple[float, float]],
               ) -> tuple[list[float], list[float]]:
    """Every inter-token gap of the short requests, split into those overlapping a long
    prompt's prefill window and the rest."""
    starts = [start for start, _ in windows]
    during: list[float] = []
    other: list[float] = []
    for sent in shorts:
        t = sent.at + sent.outcome.ttft
        for gap in sent.outcome.itl:
            before, t = t, t + gap
            # The last window opening before this gap ends overlaps it iff it ends after the
            # gap began (the windows are disjoint and in order).
            i = bisect.bisect_left(starts, t) - 1
            (during if i >= 0 and windows[i][1] > before else other).append(gap)
    return during, other


async def drive(client: httpx.AsyncClient, url: str, model: str, args: argparse.Namespace,
                vocab: int) -> tuple[list[Sent], list[Sent], float]:
    """The run itself: (short requests, long prompts, seconds until the last one ended)."""
    rng = random.Random(args.seed)

    def payload(input_len: int, output_len: int) -> dict[str, Any]:
        prompt = RandomRequest(tuple(rng.choices(range(vocab), k=input_len)), output_len)
        return completion_payload(model, prompt, ignore_eos=True)

    offsets = long_offsets(args.duration, args.long_interval, args.long_arrival == "poisson",
                           args.seed + 1)
    # Long prompts are drawn up front: an 8k-token draw would stall the loop mid-run.
    long_payloads = [payload(args.long_input_len, args.long_output_len) for _ in offsets]
    shorts: list[Sent] = []
    start = time.perf_counter()

    async def timed(body: dict[str, Any]) -> Sent:
        at = time.perf_counter() - start
        return Sent(at, await send_request(client, url, body))

    async def short_loop() -> None:
        while time.perf_counter() - start < args.duration:
            shorts.append(await timed(payload(args.short_input_len, args.short_output_len)))

    async def long_arrivals() -> list[Sent]:
        tasks = []
        for offset, body in zip(offsets, long_payloads, strict=True):
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            tasks.append(asyncio.create_task(timed(body)))
        return list(await asyncio.gather(*tasks))

    _, longs = await asyncio.gather(
        asyncio.gather(*(short_loop() for _ in range(args.short_concurrency))), long_arrivals())
    return shorts, longs, time.perf_counter() - start


def short_metrics(shorts: Sequence[Sent], longs: Sequence[Sent], duration: float,
                  percentiles: Sequence[float]) -> dict[str, Any]:
    ok = [s for s in shorts if s.outcome.success]
    output = sum(s.outcome.output_tokens for s in ok)
    gaps = [gap for s in ok for gap in s.outcome.itl]
    during, _ = split_gaps(ok, merged_windows(longs))
    tpots = [(s.outcome.latency - s.outcome.ttft) / (s.outcome.output_tokens - 1)
             for s in ok if s.outcome.output_tokens > 1]
    metrics: dict[str, Any] = {
        "completed": len(ok), "failed": len(shorts) - len(ok), "total_output_tokens": output,
        "output_throughput": output / duration,
        "max_itl_ms": max(gaps, default=0.0) * 1000.0,
        "num_itl": len(gaps), "num_itl_during_long": len(during)}
    metrics |= summarize_ms("ttft", [s.outcome.ttft for s in ok], percentiles)
    metrics |= summarize_ms("tpot", tpots, percentiles)
    metrics |= summarize_ms("itl", gaps, percentiles)
    metrics |= summarize_ms("itl_during_long", during, percentiles)
    metrics |= summarize_ms("e2el", [s.outcome.latency for s in ok], percentiles)
    return metrics


def long_metrics(longs: Sequence[Sent], percentiles: Sequence[float]) -> dict[str, Any]:
    ok = [s for s in longs if s.outcome.success]
    ttfts = [s.outcome.ttft for s in ok]
    return {"num_sent": len(longs), "completed": len(ok), "failed": len(longs) - len(ok),
            "max_ttft_ms": max(ttfts, default=0.0) * 1000.0,
            **summarize_ms("ttft", ttfts, percentiles),
            "send_times": [s.at for s in longs], "ttfts": [s.outcome.ttft for s in longs]}


async def benchmark(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """(model, results): one short and one long warmup request, then the run."""
    base_url = args.base_url.rstrip("/")
    url = f"{base_url}{args.endpoint}"
    vocab = tokenizer_vocab_size(args.tokenizer) if args.tokenizer else FALLBACK_VOCAB_SIZE
    async with client_for(args, None) as client:
        model = args.model or await served_model(client, base_url)
        print(f"warmup requests to {url} (model {model})")
        warm_rng = random.Random(args.seed + 1_000_003)  # prompts of their own: no cache hit
        for n, out in ((args.short_input_len, args.short_output_len),
                       (args.long_input_len, args.long_output_len)):
            prompt = RandomRequest(tuple(warm_rng.choices(range(vocab), k=n)), out)
            await warm_up(client, url, completion_payload(model, prompt, ignore_eos=True))
        print(f"{args.short_concurrency} short requests in a closed loop for {args.duration:g} "
              f"s; a {args.long_input_len}-token prompt every {args.long_interval:g} s "
              f"({args.long_arrival})")
        shorts, longs, duration = await drive(client, url, model, args, vocab)
    percentiles = args.metric_percentiles
    errors = sorted({s.outcome.error for s in [*shorts, *longs] if s.outcome.error})
    return model, {"duration": duration,
                   "short": short_metrics(shorts, longs, duration, percentiles),
                   "long": long_metrics(longs, percentiles), "errors": errors}


def run_interference(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.long_arrival == "fixed" and args.long_interval >= args.duration:
        parser.error(f"--long-interval {args.long_interval:g} sends no long prompt within "
                     f"--duration {args.duration:g}; make it shorter than the duration")
    ceiling = client_ceiling()  # before any request, while the GPU is idle
    model, measured = asyncio.run(benchmark(args))
    result = {**run_header("interference", ceiling, model=model, command=args.argv),
              "base_url": args.base_url, "endpoint": args.endpoint,
              "tokenizer_id": args.tokenizer, "label": args.label,
              "short_concurrency": args.short_concurrency,
              "short_input_len": args.short_input_len,
              "short_output_len": args.short_output_len, "target_duration": args.duration,
              "long_input_len": args.long_input_len, "long_output_len": args.long_output_len,
              "long_interval": args.long_interval, "long_arrival": args.long_arrival,
              "seed": args.seed, **measured}
    print(interference_table(result, args.metric_percentiles))
    for error in measured["errors"][:5]:
        print(f"failed request: {error}", file=sys.stderr)
    write_result(result, result_path(
        args.result_file, args.result_dir,
        [p for p in ["interference", model, args.label or "",
                     f"short{args.short_concurrency}x{args.short_input_len}",
                     f"long{args.long_input_len}"] if p]))
    if not (measured["short"]["completed"] and measured["long"]["completed"]):
        raise BenchError("no short request or no long prompt completed; see the errors above")
    return 0
